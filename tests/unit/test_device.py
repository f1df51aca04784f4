"""Device pinning. Each case runs in a fresh interpreter: pinning changes the process environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from udfserve.runtime.device import visible_devices_for

PIN_AND_REPORT = """
import json, os, sys
from udfserve.runtime.device import pin_device
pin_device(sys.argv[1])
keys = ["CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_CPP_MIN_LOG_LEVEL"]
print(json.dumps({key: os.environ.get(key) for key in keys}))
"""


def pinned_environment(device: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CUDA_", "TF_"))}
    env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-c", PIN_AND_REPORT, device], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cpu_hides_every_gpu() -> None:
    assert pinned_environment("cpu") == {
        "CUDA_VISIBLE_DEVICES": "",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def test_gpu_index_exposes_only_that_gpu() -> None:
    assert pinned_environment("gpu:3")["CUDA_VISIBLE_DEVICES"] == "3"


def test_existing_log_level_is_kept() -> None:
    assert pinned_environment("cpu", {"TF_CPP_MIN_LOG_LEVEL": "0"})["TF_CPP_MIN_LOG_LEVEL"] == "0"


@pytest.mark.parametrize("device", ["gpu", "gpu:", "cuda:0", "GPU:0", "gpu:-1", ""])
def test_malformed_device_is_refused(device: str) -> None:
    with pytest.raises(ValueError, match="invalid device"):
        visible_devices_for(device)


def test_pinning_after_tensorflow_is_imported_is_refused() -> None:
    code = (
        "import tensorflow\n"
        "from udfserve.runtime.device import pin_device\n"
        "try:\n"
        "    pin_device('cpu')\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert "tensorflow is already imported" in result.stdout
