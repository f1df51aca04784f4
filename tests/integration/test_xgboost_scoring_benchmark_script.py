"""The XGBoost scoring benchmark keeps working: its quick mode scores tabular_xgb with udfserve's
remote_predict, predict_batch_udf and xgboost.spark, finds every application's answers equal to
XGBoost's own to 1e-6, and reports rows/s and CPU per row for each."""

from __future__ import annotations

import pytest
from benchmark_script import run_quick


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_quick_xgboost_run_checks_the_answers_and_measures_all_three() -> None:
    result = run_quick("benchmarks.xgboost_scoring", timeout_s=600)

    assert [target["met"] for target in result["targets"]] == [True]
    assert set(result["raw"]["rounds"]) == {"remote_predict", "predict_batch_udf", "xgboost.spark"}
    for contender, (application,) in result["raw"]["rounds"].items():
        assert application["rows"] == 4096 and len(application["sample"]) == 64, contender
        (run,) = application["runs_cpu_s"]
        assert application["runs_s"][0] > 0 and sum(run.values()) > 0, contender
    server_cpu = {c: a[0]["runs_cpu_s"][0]["model server"] for c, a in result["raw"]["rounds"].items()}
    assert server_cpu["remote_predict"] > 0 and server_cpu["predict_batch_udf"] == 0
