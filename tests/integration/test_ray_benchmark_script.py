"""The Ray Data contender keeps working: its quick mode runs one Ray application over a small data
set, once and twice over in one execution, gets every row back exactly as often as it was read
with the model's predictions, and reports its CPU by
process group, its memory and its object store. Ray is the ``bench-ray`` extra, outside the CI
install: without it the test is skipped."""

from __future__ import annotations

import json

import pytest
from benchmark_script import run_module

pytest.importorskip("ray", reason="ray is the bench-ray group: pip install --group bench-ray")


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_quick_ray_run_predicts_every_row_as_often_as_read_and_reports_cpu_and_memory() -> None:
    output = run_module("benchmarks.ray_contender", ["--quick", "--rows", "8192"], timeout_s=600)
    best = json.loads(output.strip().splitlines()[-1])["best"]
    # the job itself fails unless every id came back exactly once
    assert best["rows"] == 8192 and best["runs_passes"] == [1, 2, 1]
    assert len(best["sample"]) == 64 and all(len(p) == 8 for p in best["sample"].values())
    assert best["model_loads_in_workers"] >= 1
    assert set(best["runs_cpu_s"][0]) == {"Ray driver", "Ray system", "Ray workers"}
    assert best["runs_cpu_s"][0]["Ray workers"] > 0
    assert best["peak_object_store_mib"] > 0 and best["object_store_mib"] == 1024
    assert best["peak_all_ray_mib"] > best["peak_worker_rss_total_mib"] > 0
