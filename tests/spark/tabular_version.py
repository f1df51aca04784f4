"""Another version of the example ``tabular_mlp``: the same layers, inputs and outputs, with the
weights of another seed, so that its predictions differ from version 1's.

Run it as a script, so the test process never imports TensorFlow for it:

    python tabular_version.py <version folder> <seed>

writes ``<version folder>/model.keras`` with the project's own builder of the example model.
"""

from __future__ import annotations

import sys
from pathlib import Path


def write_version(version_dir: Path, seed: int) -> None:
    from udfserve.runtime.device import import_tensorflow, pin_device

    pin_device("cpu")
    import_tensorflow()
    import keras

    from services.examples.generate_models import EXAMPLES, KERAS_FILE_NAME

    build, _, _ = EXAMPLES["tabular_mlp"]
    keras.utils.set_random_seed(seed)
    version_dir.mkdir(parents=True, exist_ok=True)
    build().save(version_dir / KERAS_FILE_NAME)


if __name__ == "__main__":
    folder_arg, seed_arg = sys.argv[1:3]
    write_version(Path(folder_arg), int(seed_arg))
