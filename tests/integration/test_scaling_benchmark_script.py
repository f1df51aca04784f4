"""The scaling benchmark keeps working: its quick mode runs every contender at both of its sizes
(the smallest and one the targets compare with it), each in its own Spark application, and reports
each point with its rows counted exactly and measured."""

from __future__ import annotations

import pytest
from benchmark_script import run_quick

QUICK_SIZES = (8_192, 16_384)
CONTENDERS = {"remote_predict", "remote_predict_arrow", "predict_batch_udf"}


@pytest.mark.slow
@pytest.mark.timeout(1260)
def test_the_quick_scaling_run_measures_every_contender_at_every_size() -> None:
    points = run_quick("benchmarks.scaling", timeout_s=1200)["raw"]["points"]
    measured = {(p["model"], p["contender"], p["rows_expected"]) for p in points}
    assert measured == {("tabular_mlp", c, rows) for c in CONTENDERS for rows in QUICK_SIZES}
    assert len(points) == len(measured)
    for point in points:
        job = point["job"]
        assert job["rows"] == point["rows_expected"]
        assert point["rows_s"] > 0 and job["warmup_s"] > 0
        assert job["peak_worker_rss_total_mib"] > 0 and job["peak_jvm_rss_mib"] > 0
        remote = point["contender"] != "predict_batch_udf"
        assert (point["server_peak_rss_mib"] is not None) == remote
        # the model loads at most once per Python worker (the daemon is one of those seen), in the
        # warm-up, not again for the timed run; a loaded machine may start a worker that never
        # gets a task of the model, so fewer loads than workers is no fault
        if remote:
            assert job["model_loads_in_workers"] == 0
        else:
            assert 1 <= job["model_loads_in_workers"] <= job["python_workers_seen"] - 1
