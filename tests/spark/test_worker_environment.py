"""The driver refuses a UDF whose local Python workers could not run it, naming PYSPARK_PYTHON.

Each job runs in a driver process of its own (``worker_env_driver.py``), since PySpark records
the workers' interpreter when the SparkContext starts. The interpreter without the client is a
fresh virtual environment of the same Python with nothing installed in it, the situation of a
driver run with ``.venv/bin/python`` while ``python3`` on PATH is another installation.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.short_lived_jvms import short_lived_jvm_environment
from udfserve.services.model_server.launcher import ServerProcess

DRIVER = Path(__file__).with_name("worker_env_driver.py")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter of this Python version with nothing installed: no pyarrow, no client."""
    folder = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python"


def run_driver(worker_python: Path, server: ServerProcess, *args: str) -> dict[str, object]:
    env = {**short_lived_jvm_environment(), "PYSPARK_PYTHON": str(worker_python)}  # one job per JVM
    completed = subprocess.run(
        [sys.executable, str(DRIVER), "--address", server.grpc_target(), "--rows", "100", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    answer: dict[str, object] = json.loads(completed.stdout.strip().splitlines()[-1])
    return answer


def test_remote_predict_refuses_local_workers_without_pyarrow_naming_pyspark_python(
    bare_python: Path, server: ServerProcess
) -> None:
    answer = run_driver(bare_python, server)
    assert answer["error"] == "WorkerEnvironmentError"
    message = str(answer["message"])
    assert f"PYSPARK_PYTHON={bare_python}" in message
    assert "cannot import pyarrow" in message
    assert f"set PYSPARK_PYTHON={sys.executable}" in message


def test_predict_arrow_refuses_local_workers_without_the_client_naming_pyspark_python(
    bare_python: Path, server: ServerProcess
) -> None:
    answer = run_driver(bare_python, server, "--udf", "predict_arrow")
    assert answer["error"] == "WorkerEnvironmentError"
    assert f"PYSPARK_PYTHON={bare_python}" in str(answer["message"])


def test_workers_that_run_this_environment_under_another_path_run_the_udf(
    server: ServerProcess, tmp_path: Path
) -> None:
    # Another name for the same environment: the driver cannot tell it apart by path, asks it,
    # and must let the job run.
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    assert run_driver(wrapper, server) == {"rows": 100}
