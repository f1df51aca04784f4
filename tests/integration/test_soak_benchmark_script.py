"""The soak keeps working: its quick mode runs two rounds of Spark jobs of every model and kind
(12 s of them at least) against a real ``udfserve node``, checks every job's rows exactly once,
samples the node throughout, and computes every trend and target it reports (whether the short
run meets them is not asserted: seconds are too short to judge a slope)."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_script import run_quick

KINDS = {"remote_predict", "remote_predict_arrow", "predict_arrow"}


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_the_quick_soak_checks_every_job_exactly_once_and_samples_the_node_throughout() -> None:
    result = run_quick("benchmarks.soak", timeout_s=900)
    raw = result["raw"]

    jobs = rows_of(raw["jobs"])
    assert {(job["model"], job["kind"]) for job in jobs} == {
        (model, kind) for model in ("tabular_mlp", "sequence_bilstm") for kind in KINDS
    }
    for job in jobs:
        n = job["expected_rows"]
        assert job["error"] is None, job["error"]
        assert (job["rows"], job["distinct_ids"], job["min_id"], job["max_id"]) == (n, n, 0, n - 1), job
        assert job["sum_ids"] == n * (n - 1) // 2 and job["bad_predictions"] == 0, job

    samples = rows_of(raw["samples"])
    assert samples[-1]["t_s"] >= 0.9 * raw["settings"]["minutes"] * 60
    for sample in samples:
        assert sample["servers"] == 1 and sample["server_rss_mib"] > 0 and sample["server_fds"] > 0
        assert sample["supervisor_rss_mib"] > 0 and sample["supervisor_threads"] > 0
        assert sample["restarts"] == 0
    assert 0 < samples[-1]["jobs_done"] <= len(jobs)  # the last jobs may end after the last sample

    for trend in raw["trends"].values():
        assert trend["samples"] >= 2 and trend["flat"] is not None
    assert all(target["met"] is not None for target in result["targets"])
    assert [t["met"] for t in result["targets"][:3]] == [True, True, True]  # jobs, rows, restarts


def rows_of(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The records the JSON holds as a list of values per field."""
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
