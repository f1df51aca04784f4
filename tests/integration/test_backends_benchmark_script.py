"""The backends benchmark keeps working: its quick mode serves the tabular MLP with TensorFlow, ONNX
Runtime and PyTorch, finds their answers equal to 1e-5 before timing anything, and reports every
measure for each of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
RESULT = REPOSITORY_ROOT / "benchmarks" / "results" / "tmp" / "quick" / "backends.json"


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_quick_backends_run_checks_the_answers_and_measures_all_three() -> None:
    RESULT.unlink(missing_ok=True)
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.backends", "--quick"],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads(RESULT.read_text())
    assert [target["met"] for target in result["targets"]] == [True]
    assert set(result["raw"]["rounds"]) == {"TensorFlow", "ONNX Runtime", "PyTorch"}
    for rounds in result["raw"]["rounds"].values():
        (measured,) = rounds
        assert measured["cold"]["serving_s"] > 0 and measured["rss_after_load_mib"] > 0
        for cell in measured["load"].values():
            # the server also counts the client's warm-up requests
            assert cell["rows_s"] > 0 and cell["shared_memory_requests"] >= cell["requests"] > 0
        assert measured["spark"]["rows"] == 8192 and measured["spark"]["shared_memory_requests"] > 0
