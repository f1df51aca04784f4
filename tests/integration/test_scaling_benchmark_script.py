"""The scaling benchmark keeps working: its quick mode runs every contender at the smallest size
and one remote contender at the larger size too (the comparison between sizes, each target kind),
each point in its own Spark application, and reports each point with its rows counted exactly and
measured, and the targets of the contender it measured at both sizes."""

from __future__ import annotations

import pytest
from benchmark_script import run_quick

SMALLEST, LARGER = 8_192, 16_384
CONTENDERS = {"remote_predict", "remote_predict_arrow", "predict_batch_udf"}
AT_BOTH_SIZES = "remote_predict"


@pytest.mark.slow
@pytest.mark.timeout(1260)
def test_the_quick_scaling_run_measures_every_contender_and_compares_one_across_sizes() -> None:
    result = run_quick("benchmarks.scaling", timeout_s=1200)
    points = result["raw"]["points"]
    measured = {(p["model"], p["contender"], p["rows_expected"]) for p in points}
    assert measured == {("tabular_mlp", c, SMALLEST) for c in CONTENDERS} | {
        ("tabular_mlp", AT_BOTH_SIZES, LARGER)
    }
    assert len(points) == len(measured)
    # rows/s, the workers' memory and the server's memory: each at the larger size against the smallest
    targets = [target["target"] for target in result["targets"]]
    assert len(targets) == 3 and all(f"{LARGER:,} rows" in target for target in targets), targets
    assert all(target.startswith(f"tabular_mlp: {AT_BOTH_SIZES},") for target in targets), targets
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
