"""Ray Data's steady rate in the benchmark: the long job's extra rows over its extra time, each job
timed from its pool's first model call, so the pool's start does not decide the difference."""

from __future__ import annotations

import pytest

from benchmarks.ray_job import RayJobResult


def result(runs_s: list[float], pool_start_s: list[float], passes: list[int]) -> RayJobResult:
    measured = RayJobResult(
        contender="ray_data",
        model="tabular_mlp",
        rows=1_000,
        partitions=4,
        runs_s=runs_s,
        runs_cpu_s=[{"Ray workers": 1.0}] * len(runs_s),
        pool_start_s=pool_start_s,
        runs_passes=passes,
    )
    measured.measure_steady()
    return measured


def test_the_steady_rate_leaves_each_jobs_pool_start_out() -> None:
    # one pass: 20 s of pool start then 1 s; eight passes: 8 s of pool start then 8 s
    measured = result([30.0, 16.0, 21.0, 16.5], [25.0, 8.0, 20.0, 8.5], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (8.0 - 1.0))


def test_the_first_job_which_runs_cold_is_left_out() -> None:
    measured = result([5.0, 9.0, 6.0, 9.0], [0.0, 0.0, 0.0, 0.0], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (9.0 - 6.0))


def test_no_steady_rate_without_a_warm_one_pass_job_and_a_long_one() -> None:
    assert result([5.0, 9.0], [1.0, 1.0], [1, 8]).steady_rows_s == 0.0
    assert result([5.0, 4.0], [1.0, 1.0], [1, 1]).steady_rows_s == 0.0
