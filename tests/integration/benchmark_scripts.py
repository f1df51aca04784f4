"""Runs a benchmark script's quick mode as a user would, for the tests that it keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
QUICK_RESULTS = REPOSITORY_ROOT / "benchmarks" / "results" / "tmp" / "quick"


def run_quick(comparison: str, timeout_s: float) -> dict[str, Any]:
    """``python -m benchmarks.<comparison> --quick`` in a child, its Spark workers on this
    interpreter; the result it wrote (a stale one removed first), or a failure with its output."""
    result = QUICK_RESULTS / f"{comparison}.json"
    result.unlink(missing_ok=True)
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{comparison}", "--quick"],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded
