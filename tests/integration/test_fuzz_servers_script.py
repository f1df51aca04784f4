"""The hostile-request fuzzing script keeps working: its quick mode starts both servers (python
and native KServe front ends), sends a few hundred hostile requests over both protocols, and
finds no crash, no hang and no INTERNAL or UNKNOWN answer to bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_fuzz_run_finds_no_crash_hang_or_internal_status(tmp_path: Path) -> None:
    output = tmp_path / "fuzz.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.fuzz_servers", "--quick", "--output", str(output)],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    reports = json.loads(output.read_text())
    assert [report["name"] for report in reports] == [
        "arrow",
        "kserve python",
        "kserve stream",
        "kserve native",
    ]
    for report in reports:
        assert report["requests"] >= 60 and not report["crashed"] and report["hangs"] == 0
        assert report["internal_or_unknown"] == []
