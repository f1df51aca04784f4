"""What a user reads on stderr when a process starts TensorFlow on a CPU-only machine: none of
the framework's start-up lines (its oneDNN and CUDA driver notices, the ``E0000 ... failed call
to cuInit`` of a process that hid the GPUs on purpose), and one line naming the device."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from udfserve.services.model_server.launcher import launch_server

FRAMEWORK_LINE = re.compile(r"^[IWEF]\d{4} ")
DEVICE_LINE = "tensorflow computes on the CPU (device cpu; CUDA_VISIBLE_DEVICES='' hides the GPUs)"


def clean_environment() -> dict[str, str]:
    """This process's environment without settings of udfserve, CUDA or TensorFlow's log level."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("UDFSERVE_", "CUDA_", "TF_"))}


def assert_no_chatter_and_one_device_line(stderr: str) -> None:
    lines = stderr.splitlines()
    assert [line for line in lines if FRAMEWORK_LINE.match(line) or "absl::InitializeLog" in line] == []
    device_lines = [re.sub(r"tensorflow \S+ computes", "tensorflow computes", line) for line in lines]
    assert sum(line.endswith(DEVICE_LINE) for line in device_lines) == 1, stderr


def test_generating_the_example_models_shows_no_framework_start_up_lines(tmp_path: Path) -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(tmp_path / "repository")],
        capture_output=True, text=True, timeout=300, env=clean_environment(),
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    assert_no_chatter_and_one_device_line(generated.stderr)


def test_a_servers_log_shows_no_framework_start_up_lines(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    server = launch_server(
        example_repository, socket=socket_dir / "quiet.sock", port=None, http_port=None,
        extra_args=["--models", "tabular_mlp"], log_path=tmp_path / "server.log", env=clean_environment(),
    )  # fmt: skip
    try:
        log = server.log_tail(lines=1_000)  # SERVING: the model is loaded, so TensorFlow has started
    finally:
        server.terminate()
    assert_no_chatter_and_one_device_line(log)


FALLBACK_LOAD = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO)
from udfserve.spark_client.executor.fallback import load_cpu_model
load_cpu_model(Path(sys.argv[1]), "tabular_mlp")
"""


def test_the_cpu_fallback_shows_no_framework_start_up_lines(example_repository: Path) -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", FALLBACK_LOAD, str(example_repository)],
        capture_output=True, text=True, timeout=300, env=clean_environment(),
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert_no_chatter_and_one_device_line(loaded.stderr)
