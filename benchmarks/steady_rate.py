"""The steady rate of a batch job: its rows/s with every fixed cost of a job taken out.

A job's wall time is a fixed part (scheduling its tasks, starting a pool, loading a model) and a
part that grows with its rows. An application that alternates a job over some files with a job
over the same files several times over (a folder of hard links beside them, ``long_folder``)
measures both: the long job's extra rows over its extra time is the rate a job of hours sees,
and its extra CPU over those rows what each row costs at that rate. Spark's jobs
(``benchmarks.spark_job``) and Ray Data's (``benchmarks.ray_job``) choose their runs and do the
arithmetic here, so the two steady rates are measured alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def repeated_files(files: Sequence[Path], passes: int, folder: Path) -> Path:
    """A folder holding ``files`` ``passes`` times over, as hard links (no bytes copied). One
    folder rather than a list of paths: Ray Data indexes a list in several threads, which race on an
    optional import of fsspec's HTTP file system and fail where aiohttp is not installed.

    Made once and reused; a link that no longer points at its file (the data written again) is
    made again, and a parquet file that is none of the links is removed, so the folder always holds
    exactly ``passes`` copies of each file."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for number in range(passes):
        for file in files:
            link = folder / f"pass-{number}-{file.name}"
            wanted.add(link.name)
            if link.exists() and os.path.samefile(link, file):
                continue
            link.unlink(missing_ok=True)
            os.link(file, link)
    for stale in folder.glob("*.parquet"):
        if stale.name not in wanted:
            stale.unlink()
    return folder


def long_folder(data: Path, passes: int) -> Path:
    """``data``'s parquet files ``passes`` times over, in ``<data>-x<passes>`` beside it (not in it:
    readers of ``data`` search it recursively)."""
    files = sorted(data.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no parquet files in {data}; expected the data set's folder")
    return repeated_files(files, passes, data.parent / f"{data.name}-x{passes}")


def steady_runs(short_runs_s: Sequence[float], long_runs_s: Sequence[float]) -> tuple[int, int] | None:
    """The runs the steady rate compares, as (index in ``short_runs_s``, index in ``long_runs_s``):
    the fastest short run after the first (which pays the workers' or the pool's start) and the
    fastest long run; None without both."""
    if len(short_runs_s) < 2 or not long_runs_s:
        return None
    short = min(range(1, len(short_runs_s)), key=lambda index: short_runs_s[index])
    long = min(range(len(long_runs_s)), key=lambda index: long_runs_s[index])
    return short, long


@dataclass(frozen=True)
class SteadyPair:
    """A short and a long run of one application, the two the steady rate compares."""

    short_s: float
    long_s: float
    extra_rows: int
    """The long run's rows less the short run's."""
    short_cpu_s: Mapping[str, float]
    long_cpu_s: Mapping[str, float]
    """CPU seconds of each run by process group."""

    @property
    def rows_s(self) -> float:
        """The extra rows over the extra time; 0 where the long run was not slower (no rate to
        read: a neighbour's burst slowed the short run more than the long run's rows did)."""
        extra_s = self.long_s - self.short_s
        return self.extra_rows / extra_s if self.extra_rows > 0 and extra_s > 0 else 0.0

    def cpu_s_per_million_rows(self) -> dict[str, float]:
        """Each process group's extra CPU seconds over the extra rows, per million rows."""
        if self.extra_rows <= 0:
            return {}
        groups = [*self.long_cpu_s, *(g for g in self.short_cpu_s if g not in self.long_cpu_s)]
        extra = {g: self.long_cpu_s.get(g, 0.0) - self.short_cpu_s.get(g, 0.0) for g in groups}
        return {group: seconds / self.extra_rows * 1e6 for group, seconds in extra.items()}
