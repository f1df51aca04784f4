"""scripts/gpu_check.sh keeps working between GPU loans: its CPU dry run, run as a user runs it,
goes through every check of the GPU run (a real server, a real out-of-memory under a cap, a real
node, executors scoring through its socket and shared memory), skips only what needs an NVIDIA
device, and fails no check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NEEDS_NVIDIA = {
    ("serve", "device memory the server holds (NVML)"),
    ("node", "NVML finds the GPU"),
    ("heavy", "heavy_conv in-process on the GPU"),
    ("heavy", "GPU utilisation while one server computes"),
}
"""The findings the dry run cannot make: each needs NVML or a CUDA device."""


@dataclass(frozen=True)
class DryRun:
    exit_code: int
    output: str
    findings: list[dict[str, Any]]

    def finding(self, check: str, what: str) -> dict[str, Any]:
        matches = [f for f in self.findings if f["check"] == check and f["what"] == what]
        assert len(matches) == 1, f"expected one finding {check!r} / {what!r}, found {len(matches)}"
        return matches[0]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> DryRun:
    output = tmp_path_factory.mktemp("gpu-check")
    completed = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--output", str(output)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    report = output / "gpu_check.json"
    assert report.exists(), completed.stdout[-3000:] + completed.stderr[-3000:]
    findings = json.loads(report.read_text())["findings"]
    return DryRun(completed.returncode, completed.stdout + completed.stderr, findings)


@pytest.mark.timeout(600)
def test_the_dry_run_fails_no_check_and_exits_0(dry_run: DryRun) -> None:
    failed = [f for f in dry_run.findings if f["verdict"] == "FAILED"]

    assert failed == [], dry_run.output[-3000:]
    assert dry_run.exit_code == 0, dry_run.output[-3000:]


@pytest.mark.timeout(600)
def test_the_dry_run_skips_exactly_what_needs_an_nvidia_device(dry_run: DryRun) -> None:
    skipped = {(f["check"], f["what"]) for f in dry_run.findings if f["verdict"].startswith("skipped")}

    assert skipped == NEEDS_NVIDIA


@pytest.mark.timeout(600)
def test_the_dry_run_reaches_every_check_of_the_gpu_run(dry_run: DryRun) -> None:
    checks = {f["check"] for f in dry_run.findings}

    assert checks == {"setup", "serve", "oom", "node", "executor", "heavy"}
    for model in ("mlp_onnx", "null_onnx", "heavy_conv"):
        assert dry_run.finding("executor", f"{model}: requests through shared memory")["verdict"] == "ok"
        assert (
            dry_run.finding("executor", f"{model}: executors never initialise CUDA (nor load pandas)")[
                "verdict"
            ]
            == "ok"
        )


@pytest.mark.timeout(600)
def test_the_batch_too_big_for_the_cap_really_runs_out_of_memory_and_is_split(dry_run: DryRun) -> None:
    oom = dry_run.finding("oom", "one request of 32,768 rows under a cap")

    assert oom["verdict"] == "ok"
    assert not oom["figure"].startswith("0 calls"), oom


@pytest.mark.timeout(600)
def test_the_table_printed_names_every_finding(dry_run: DryRun) -> None:
    for finding in dry_run.findings:
        assert f"| {finding['check']} | {finding['what']} |" in dry_run.output
