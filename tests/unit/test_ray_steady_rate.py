"""Ray Data's steady rate in the benchmark: whole jobs compared, the pool's start included, since
the reads run while the pool starts and a long job's pool starts later."""

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


def test_the_steady_rate_compares_whole_jobs_pool_starts_included() -> None:
    # the long jobs' pools start later (their reads compete with them): that time is work
    measured = result([10.0, 17.0, 8.0, 18.0], [7.0, 10.0, 7.0, 10.0], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (17.0 - 8.0))


def test_the_first_job_which_runs_cold_is_left_out() -> None:
    measured = result([5.0, 9.0, 6.0, 9.0], [0.0, 0.0, 0.0, 0.0], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (9.0 - 6.0))


def test_no_steady_rate_without_a_warm_one_pass_job_and_a_long_one() -> None:
    assert result([5.0, 9.0], [1.0, 1.0], [1, 8]).steady_rows_s == 0.0
    assert result([5.0, 4.0], [1.0, 1.0], [1, 1]).steady_rows_s == 0.0
