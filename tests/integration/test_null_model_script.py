"""The null-model benchmark keeps working: its quick mode measures every udfserve path and its
model-less floor on both null models, counts every row back exactly once with the model's answer,
and compares each path with its floor."""

from __future__ import annotations

import math

import pytest
from benchmark_script import run_quick

PATHS = {"remote_predict", "remote_predict_arrow", "predict_arrow", "predict_files"}
FLOORS = {"pandas_udf", "arrow_udf", "map_in_arrow", "map_in_arrow_files"}
KEPT = {"null_slice": 8, "null_wide": 1024}


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_quick_null_model_run_measures_every_path_beside_its_floor() -> None:
    result = run_quick("benchmarks.null_model", timeout_s=600)
    models = result["raw"]["models"]
    assert set(models) == set(KEPT)
    for name, measured in models.items():
        rows = measured["rows"]
        assert set(measured["contenders"]) == PATHS | FLOORS, name
        for contender, answer in measured["contenders"].items():
            where = f"{name}/{contender}"
            assert answer["checked_rows"] == answer["distinct_ids"] == rows, where
            assert answer["values"] == rows * KEPT[name], where
            assert answer["sampled_rows"] == 64 and answer["max_abs_difference"] == 0.0, where
            assert len(answer["runs"]) == 1 and answer["runs"][0]["seconds"] > 0, where
            cpu = answer["runs"][0]["cpu_s"]
            assert cpu["JVM"] > 0 and cpu["Python workers"] > 0, where
        # the paths were answered by the server (fallback='error': no fallback in the worker),
        # whose CPU time psutil reads in 10 ms ticks: a quick run's paths together use some
        server_cpu = sum(measured["contenders"][c]["runs"][0]["cpu_s"]["model server"] for c in PATHS)
        assert server_cpu > 0, name

    rates = next(t for t in result["tables"] if t["title"].startswith("rows/s"))
    assert len(rates["rows"]) == len(KEPT) * len(PATHS | FLOORS)
    ratios = [row["÷ floor"] for row in rates["rows"] if row["÷ floor"] is not None]
    assert len(ratios) == len(KEPT) * len(PATHS)
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in ratios)
    verdicts = [t for t in result["targets"] if "of its floor" in t["target"]]
    assert len(verdicts) == len(KEPT) * len(PATHS)
    assert all(t["met"] in (True, False) for t in result["targets"])
