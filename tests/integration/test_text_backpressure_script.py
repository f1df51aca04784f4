"""The back-pressure comparison keeps working: its quick mode measures where a call of the example
text classifier's time goes, the server alone, the demo of this tree (reading its report) and the
demo's job without a model (whether the short run meets the targets is not asserted: it is a
benchmark's to measure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_script import QUICK_RESULTS, run_module


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quick_back_pressure_comparison_reads_the_demos_report(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    generate = [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(repository)]
    subprocess.run([*generate, "--text-classifier"], check=True, capture_output=True, timeout=600)
    result_file = QUICK_RESULTS / "text_backpressure.json"
    result_file.unlink(missing_ok=True)
    run_module("benchmarks.text_backpressure", ["--quick", "--model-repository", str(repository)], 780)
    result = json.loads(result_file.read_text())

    calls = result["raw"]["calls"]
    assert set(calls) == {"tokenizer alone", "model alone", "tokenizer + model"}
    assert all(rate > 0 for rates in calls.values() for rate in rates)
    [alone] = result["raw"]["alone"]["this tree"]
    assert alone["rows_per_s"] > 0 and alone["in_model_calls"] > 0
    [demo] = result["raw"]["demos"]["this tree"]
    assert demo["rows_per_s"] > 0 and demo["batches"] > 0
    assert demo["resends"] >= 0 and demo["waited_s"] >= 0 and demo["model_call_s"] > 0
    assert all(rate > 0 for rate in result["raw"]["spark_floor"])
    assert len(result["targets"]) == 3 and all(target["met"] is not None for target in result["targets"])
