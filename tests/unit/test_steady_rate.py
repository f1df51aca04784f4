"""The benchmarks' steady rate: a long job's extra rows over its extra time, the same arithmetic for
Spark's jobs and Ray Data's, and the folder of hard links the long jobs read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.ray_job import RayJobResult
from benchmarks.spark_job import Job, JobResult
from benchmarks.steady_rate import long_folder

CPU = {"Python workers": 1.0, "JVM": 2.0, "model server": 3.0}
LONG_CPU = {"Python workers": 4.5, "JVM": 9.0, "model server": 17.0}


def spark_result(runs_s: list[float], long_runs_s: list[float], rows: int = 1000) -> JobResult:
    result = JobResult(
        "predict_files",
        "tabular_mlp",
        rows,
        4,
        runs_s=runs_s,
        runs_cpu_s=[dict(CPU) for _ in runs_s],
        long_rows=rows * 8,
        long_runs_s=long_runs_s,
        long_runs_cpu_s=[dict(LONG_CPU) for _ in long_runs_s],
    )
    result.measure_steady()
    return result


def test_the_steady_rate_is_the_long_jobs_extra_rows_over_its_extra_time() -> None:
    # (8,000 - 1,000) rows in 3.5 - 1.5 s: the fastest long job against the fastest short one
    result = spark_result(runs_s=[5.0, 2.0, 1.5], long_runs_s=[4.0, 3.5])
    assert result.steady_rows_s == pytest.approx(7000 / 2.0)


def test_the_first_short_job_is_never_the_one_compared() -> None:
    # the cold first job is left out even when it happened to be the fastest
    result = spark_result(runs_s=[1.0, 2.0], long_runs_s=[4.0])
    assert result.steady_rows_s == pytest.approx(7000 / 2.0)


def test_without_a_warm_short_job_or_a_long_one_the_steady_rate_is_not_measured() -> None:
    for runs_s, long_runs_s in (([1.0], [4.0]), ([1.0, 2.0], [])):
        result = spark_result(runs_s, long_runs_s)
        assert result.steady_rows_s == 0.0
        assert result.steady_cpu_s_per_million_rows == {}


def test_a_long_job_no_slower_than_the_short_one_gives_no_rate() -> None:
    result = spark_result(runs_s=[5.0, 2.0], long_runs_s=[2.0])
    assert result.steady_rows_s == 0.0
    assert result.steady_cpu_s_per_million_rows == {}


def test_the_steady_cpu_is_the_long_jobs_extra_cpu_per_million_extra_rows() -> None:
    result = spark_result(runs_s=[5.0, 2.0], long_runs_s=[4.0])
    assert result.steady_cpu_s_per_million_rows == pytest.approx(
        {"Python workers": 3.5 / 7000 * 1e6, "JVM": 7.0 / 7000 * 1e6, "model server": 14.0 / 7000 * 1e6}
    )


def test_ray_and_spark_runs_of_the_same_times_give_the_same_steady_rate_and_cpu() -> None:
    spark = spark_result(runs_s=[5.0, 2.0, 1.5], long_runs_s=[4.0, 3.5])
    # Ray keeps its runs in one list, in the order they ran: one pass, eight, one, eight, one
    ray = RayJobResult(
        "ray_data",
        "tabular_mlp",
        1000,
        4,
        runs_s=[5.0, 4.0, 2.0, 3.5, 1.5],
        runs_cpu_s=[CPU, LONG_CPU, CPU, LONG_CPU, CPU],
        runs_passes=[1, 8, 1, 8, 1],
    )
    ray.measure_steady()
    assert ray.steady_rows_s == pytest.approx(spark.steady_rows_s)
    assert ray.steady_cpu_s_per_million_rows == pytest.approx(spark.steady_cpu_s_per_million_rows)


def parquet_files(folder: Path, count: int) -> list[Path]:
    folder.mkdir()
    files = [folder / f"part-{index:03d}.parquet" for index in range(count)]
    for index, file in enumerate(files):
        file.write_bytes(b"file %d" % index)
    return files


def test_the_long_folder_holds_each_file_as_often_as_the_passes_as_hard_links_beside_the_data(
    tmp_path: Path,
) -> None:
    files = parquet_files(tmp_path / "data", 2)
    folder = long_folder(tmp_path / "data", 3)
    assert folder.parent == tmp_path and folder.name == "data-x3"
    links = sorted(folder.iterdir())
    assert len(links) == 6
    for file in files:
        copies = [link for link in links if os.path.samefile(link, file)]
        assert len(copies) == 3
        assert file.stat().st_nlink == 4  # the file and its three links: no bytes copied


def test_the_long_folder_is_made_once_and_reused(tmp_path: Path) -> None:
    parquet_files(tmp_path / "data", 2)
    first = long_folder(tmp_path / "data", 2)
    inodes = {link.name: link.stat().st_ino for link in first.iterdir()}
    again = long_folder(tmp_path / "data", 2)
    assert again == first
    assert {link.name: link.stat().st_ino for link in again.iterdir()} == inodes


def test_the_long_folder_follows_data_written_again(tmp_path: Path) -> None:
    files = parquet_files(tmp_path / "data", 2)
    folder = long_folder(tmp_path / "data", 2)
    # a new file in place of the first (a new inode), and the second file gone
    replacement = tmp_path / "new.parquet"
    replacement.write_bytes(b"written again")
    replacement.replace(files[0])
    files[1].unlink()
    long_folder(tmp_path / "data", 2)
    links = sorted(folder.iterdir())
    assert len(links) == 2
    assert all(os.path.samefile(link, files[0]) for link in links)


def test_a_long_folder_of_a_folder_without_parquet_files_names_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no parquet files in .*empty"):
        long_folder(tmp_path / "empty", 2)


def test_a_job_with_long_passes_needs_data_two_passes_and_two_runs() -> None:
    with pytest.raises(ValueError, match="`data`, which is not set"):
        Job("predict_files", "tabular_mlp", long_passes=8, runs=3)
    with pytest.raises(ValueError, match="expected long_passes >= 2 and runs >= 2"):
        Job("predict_files", "tabular_mlp", data="data", long_passes=1, runs=3)
    with pytest.raises(ValueError, match="expected long_passes >= 2 and runs >= 2"):
        Job("predict_files", "tabular_mlp", data="data", long_passes=8, runs=1)


# Ray Data's runs: whole jobs compared, the pool's start included, since the reads run while the
# pool starts and a long job's pool starts later.


def ray_result(runs_s: list[float], pool_start_s: list[float], passes: list[int]) -> RayJobResult:
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


def test_rays_steady_rate_compares_whole_jobs_pool_starts_included() -> None:
    # the long jobs' pools start later (their reads compete with them): that time is work
    measured = ray_result([10.0, 17.0, 8.0, 18.0], [7.0, 10.0, 7.0, 10.0], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (17.0 - 8.0))


def test_rays_first_job_which_runs_cold_is_left_out() -> None:
    measured = ray_result([5.0, 9.0, 6.0, 9.0], [0.0, 0.0, 0.0, 0.0], [1, 8, 1, 8])
    assert measured.steady_rows_s == pytest.approx(7 * 1_000 / (9.0 - 6.0))


def test_ray_has_no_steady_rate_without_a_warm_one_pass_job_and_a_long_one() -> None:
    assert ray_result([5.0, 9.0], [1.0, 1.0], [1, 8]).steady_rows_s == 0.0
    assert ray_result([5.0, 4.0], [1.0, 1.0], [1, 1]).steady_rows_s == 0.0
