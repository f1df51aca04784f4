"""The backends benchmark keeps working: its quick mode serves the tabular MLP with TensorFlow, ONNX
Runtime and PyTorch, finds each one's answers equal to TensorFlow's to 1e-5 before its load, and
reports every measure for each of them."""

from __future__ import annotations

import pytest
from benchmark_script import run_quick


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_quick_backends_run_checks_the_answers_and_measures_all_three() -> None:
    result = run_quick("benchmarks.backends", timeout_s=600)
    assert [target["met"] for target in result["targets"]] == [True]
    assert set(result["raw"]["rounds"]) == {"TensorFlow", "ONNX Runtime", "PyTorch"}
    for rounds in result["raw"]["rounds"].values():
        (measured,) = rounds
        assert measured["cold"]["serving_s"] > 0 and measured["rss_after_load_mib"] > 0
        for cell in measured["load"].values():
            # the server also counts the client's warm-up requests
            assert cell["rows_s"] > 0 and cell["shared_memory_requests"] >= cell["requests"] > 0
        assert measured["spark"]["rows"] == 8192 and measured["spark"]["shared_memory_requests"] > 0
