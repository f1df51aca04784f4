"""Models that exist only for the benchmarks, written into a benchmark's own model repository.

The transport comparison needs a model that does no work, so that what it measures is the wire:
an identity (``keras.layers.Identity``) from float32 ``[width]`` to float32 ``[width]``. Run as a
child process (``python -m benchmarks.models --output DIR``) so that the benchmark driver itself
never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import child_env

logger = logging.getLogger(__name__)

IDENTITY_MODEL = "identity"


def write_config(model_dir: Path, config: Mapping[str, Any]) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")


def write_identity_model(root: Path, width: int, config: Mapping[str, Any]) -> Path:
    """Write ``<root>/identity/1/model.keras`` and its config.yaml; returns the model folder."""
    import keras

    features = keras.Input(shape=(width,), dtype="float32", name="features")
    same = keras.layers.Identity(name="same")(features)
    model = keras.Model(features, same, name=IDENTITY_MODEL)
    model_dir = root / IDENTITY_MODEL
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    model.save(model_dir / "1" / "model.keras")
    write_config(model_dir, {"name": IDENTITY_MODEL, **config})
    return model_dir


def generate_identity_in_child(root: Path, width: int, config: Mapping[str, Any]) -> Path:
    """Write the identity model from a child process (TensorFlow stays out of this process)."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.models",
        "--output",
        str(root),
        "--width",
        str(width),
        "--config",
        yaml.safe_dump(dict(config), default_flow_style=True).strip(),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env())
    if completed.returncode != 0:
        raise RuntimeError(
            f"writing the identity model into {root} failed with exit code {completed.returncode}: "
            f"{completed.stderr[-2000:]}"
        )
    return root / IDENTITY_MODEL


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the benchmark identity model.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--config", default="{}", help="config.yaml fields, as YAML")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config = yaml.safe_load(args.config) or {}
    write_identity_model(args.output, args.width, config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
