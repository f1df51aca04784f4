"""A benchmark script's quick mode, run as a user runs it, for the tests that keep the scripts working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.short_lived_jvms import short_lived_jvm_environment

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
QUICK_RESULTS = REPOSITORY_ROOT / "benchmarks" / "results" / "tmp" / "quick"


def run_module(module: str, arguments: list[str], timeout_s: float) -> str:
    """Run ``python -m <module> <arguments>`` from the repository's root, its Spark workers on this
    interpreter and its JVMs short-lived ones (``short_lived_jvm_environment``: a quick run's
    applications live seconds); its standard output, or a failure with the end of its output."""
    environment = {
        **short_lived_jvm_environment(),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    completed = subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def run_quick(module: str, timeout_s: float) -> dict[str, Any]:
    """Run ``python -m <module> --quick``; the result it wrote (``<comparison>.json`` of the quick
    results), never one an earlier run left."""
    result = QUICK_RESULTS / f"{module.rsplit('.', 1)[-1]}.json"
    result.unlink(missing_ok=True)
    run_module(module, ["--quick"], timeout_s)
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded
