"""Comparison 9, an hour of load: Spark jobs back to back against one ``udfserve node``.

    python -m benchmarks.soak [--minutes 60] [--sample-s 30] [--application-minutes M] [--quick]

One node (the supervisor and one CPU model server serving ``tabular_mlp`` and
``sequence_bilstm``) takes Spark jobs for ``--minutes``: each job reads one model's parquet
files, predicts through one of the client's three ways (pandas ``remote_predict``, its Arrow
kind, ``predict_arrow``) and checks in one aggregate that every row came back exactly once with
a prediction of the right width (``benchmarks.soak_jobs``). The jobs run in one long-lived Spark
application, the way a user's hours-long job does, its Python workers and their connections
reused from job to job; ``--application-minutes`` starts a fresh application that often instead,
which also turns over the server's connections.

Every ``--sample-s`` the node is sampled (``benchmarks.soak_sampling``): resident and
proportional memory, descriptors and threads of the server and the supervisor, the payload files
of the node's shared-memory folder (named, or held open), the supervisor's restart counter, and
the Spark workers' and JVM's memory. After the warm-up (the first sixth of the run: 10 of 60
minutes; longer if some model and kind had not finished a job by then) memory must not rise by
1 MiB per 10 minutes on a least-squares line, and descriptors, threads and files must show no
rising trend (see ``soak_sampling.trend``). ``--quick`` checks that the script works: two rounds
of the six model-and-kind jobs, small ones, sampled every second (the second round's samples come
after the warm-up, so every trend is computed), and more jobs only if the two rounds end within
12 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import plots
from benchmarks.cli import add_common_arguments, configure_logging, results_dir, write_and_print
from benchmarks.processes import LOGS_DIR, Workspace, child_env
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.soak_jobs import JobCheck, Plan
from benchmarks.soak_sampling import MEMORY_SLOPE_LIMIT_MIB_PER_10_MIN, NodeWatch, Sample, Trend, trend
from benchmarks.spark_job import write_dataset
from udfserve.services.demo_node import running_node

logger = logging.getLogger(__name__)

NAME = "soak"
MODELS = ("tabular_mlp", "sequence_bilstm")
WARM_UP_FRACTION = 1 / 6
NODE_START_TIMEOUT_S = 300.0
SHARED_MEMORY_ROOT = Path("/dev/shm")


@dataclass(frozen=True)
class Settings:
    quick: bool
    minutes: float
    sample_s: float
    application_minutes: float | None
    """None: one Spark application for the whole run."""
    rows: dict[str, int]
    files: int = 4
    min_jobs: int = 0
    """Jobs to run whatever the time (``soak_jobs.Plan.min_jobs``)."""

    @property
    def warm_up_s(self) -> float:
        """The least warm-up: a sixth of the run (see ``warm_up_end_s``)."""
        return self.minutes * 60 * WARM_UP_FRACTION

    @classmethod
    def make(cls, quick: bool) -> Settings:
        """A job of either model takes a few seconds here: hundreds of jobs in an hour."""
        if quick:
            rows = {"tabular_mlp": 8_192, "sequence_bilstm": 2_048}
            # two rounds of the 2 models x 3 kinds: each pair's first job ends the warm-up
            # (``warm_up_end_s``), the second round runs while the trends' samples are taken; a
            # job here is a second or two, mostly Spark's own, so the two rounds outlast 12 s
            return cls(quick, minutes=0.2, sample_s=1, application_minutes=None, rows=rows, min_jobs=12)
        rows = {"tabular_mlp": 200_000, "sequence_bilstm": 20_000}
        return cls(quick, minutes=60, sample_s=30, application_minutes=None, rows=rows)


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the soak is not sampled by a profiler."""
    return run_soak(workspace, Settings.make(quick))


def run_soak(workspace: Workspace, settings: Settings) -> ComparisonResult:
    started = time.perf_counter()
    repository = workspace.repository(NAME, {model: {} for model in MODELS})
    datasets = {}
    for model in MODELS:
        datasets[model] = str(workspace.path(f"data-{model}"))
        write_dataset(Path(datasets[model]), model, settings.rows[model], settings.files)
    # The node's own shared-memory folder, so that no other program's udfserve files are counted.
    shared_root = SHARED_MEMORY_ROOT if SHARED_MEMORY_ROOT.is_dir() else workspace.root
    shared_memory_dir = Path(tempfile.mkdtemp(prefix="udfserve-soak-", dir=shared_root))
    node_flags = ["--models", ",".join(MODELS), f"--server-args=--shared-memory-dir {shared_memory_dir}"]
    try:
        with running_node(repository, "cpu", NODE_START_TIMEOUT_S, node_flags) as node:
            client = {
                "discovery_file": str(node.discovery_file),
                "fallback": "error",  # a job that cannot reach the node fails rather than use the CPU
                "shared_memory_dir": str(shared_memory_dir),
            }
            soak = _Soak(workspace, settings, datasets, client)
            watch = NodeWatch(
                node.process.pid,
                node.discovery_file.parent,
                shared_memory_dir,
                soak.spark_pid,
                soak.jobs_done,
            )
            samples = soak.run(watch)
    finally:
        shutil.rmtree(shared_memory_dir, ignore_errors=True)
    jobs = soak.jobs()
    warm_up_s = warm_up_end_s(settings, jobs, watch.started_at)
    return _result(settings, warm_up_s, samples, jobs, soak.crashed, time.perf_counter() - started)


def warm_up_end_s(settings: Settings, jobs: Sequence[JobCheck], origin: float) -> float:
    """Seconds after ``origin`` that the warm-up ends: a sixth of the run, or later if a model
    and kind had not finished a job by then. Until each has, the server still meets requests of
    a kind for the first time, and grows to serve them: a short run's trend would count that
    as a leak."""
    first_done: dict[tuple[str, str], float] = {}
    for job in jobs:
        done = job.started_at + job.duration_s - origin
        key = (job.model, job.kind)
        first_done[key] = min(first_done.get(key, done), done)
    return max([settings.warm_up_s, *first_done.values()])


class _Soak:
    """Spark applications one after the other until the run's end, the node sampled meanwhile."""

    def __init__(
        self, workspace: Workspace, settings: Settings, datasets: dict[str, str], client: dict[str, str]
    ) -> None:
        self._settings = settings
        self._datasets = datasets
        self._client = client
        self._results = workspace.path("jobs.jsonl")
        self._results.touch()
        self._process: subprocess.Popen[bytes] | None = None
        self.crashed: list[str] = []
        """Applications that exited with an error, with their log's tail."""

    def spark_pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def jobs(self) -> list[JobCheck]:
        lines = self._results.read_text(encoding="utf-8").splitlines()
        return [JobCheck(**json.loads(line)) for line in lines if line.strip()]

    def jobs_done(self) -> int:
        return len(self._results.read_text(encoding="utf-8").splitlines())

    def _start_application(self, index: int, end: float) -> subprocess.Popen[bytes]:
        minutes = self._settings.application_minutes
        deadline = min(end, time.time() + minutes * 60) if minutes else end
        plan = Plan(
            deadline=deadline,
            datasets=self._datasets,
            rows=self._settings.rows,
            results_file=str(self._results),
            client_settings=self._client,
            application=index,
            first_job=self.jobs_done(),
            min_jobs=self._settings.min_jobs,
        )
        LOGS_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOGS_DIR / f"soak-spark-{index}.log"
        logger.info("soak: Spark application %d (its log: %s)", index, log_path)
        with open(log_path, "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "benchmarks.soak_jobs", json.dumps(asdict(plan))],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}),
            )

    def _ended(self, process: subprocess.Popen[bytes], index: int, jobs_before: int) -> None:
        """Note an application that failed; stop the soak if one ran no job at all."""
        log_path = LOGS_DIR / f"soak-spark-{index}.log"
        if process.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            self.crashed.append(f"application {index} exited with code {process.returncode}: {tail}")
        if self.jobs_done() == jobs_before:
            raise RuntimeError(
                f"Spark application {index} ran no job (exit code {process.returncode}); its log "
                f"{log_path} ends:\n{log_path.read_text(errors='replace')[-3000:]}"
            )

    def run(self, watch: NodeWatch) -> list[Sample]:
        end = time.time() + self._settings.minutes * 60
        samples: list[Sample] = []
        index, jobs_before = 0, 0
        next_sample = time.monotonic()
        try:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    self._ended(self._process, index - 1, jobs_before)
                    self._process = None
                if self._process is None:
                    if time.time() >= end:
                        break
                    jobs_before = self.jobs_done()
                    self._process = self._start_application(index, end)
                    index += 1
                if time.monotonic() >= next_sample:
                    samples.append(watch.sample())
                    _log_sample(samples[-1], self._settings)
                    next_sample += self._settings.sample_s
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=max(0.0, next_sample - time.monotonic()))
        finally:
            if self._process is not None and self._process.poll() is None:
                self._process.terminate()
                self._process.wait(timeout=60)
        return samples


def _log_sample(sample: Sample, settings: Settings) -> None:
    logger.info(
        "soak %.1f/%.0f min: %d jobs; server %.0f MiB, %d fds, %d threads; supervisor %.1f MiB; "
        "%d shared-memory files; %d restarts",
        sample.t_s / 60, settings.minutes, sample.jobs_done, sample.server_rss_mib, sample.server_fds,
        sample.server_threads, sample.supervisor_rss_mib, sample.shared_memory_files, sample.restarts,
    )  # fmt: skip


# -- the result ------------------------------------------------------------------------------------
MEASURES = (
    # attribute, label, unit, kind (memory, count, or info: reported, not judged)
    ("server_rss_mib", "model server, resident", "MiB", "memory"),
    ("server_pss_mib", "model server, proportional", "MiB", "info"),
    ("supervisor_rss_mib", "supervisor, resident", "MiB", "memory"),
    ("supervisor_pss_mib", "supervisor, proportional", "MiB", "info"),
    ("server_fds", "model server, open descriptors", "fds", "count"),
    ("supervisor_fds", "supervisor, open descriptors", "fds", "count"),
    ("server_threads", "model server, threads", "threads", "count"),
    ("supervisor_threads", "supervisor, threads", "threads", "count"),
    ("shared_memory_files", "shared-memory payload files, named or held open", "files", "count"),
    ("shared_memory_mib", "shared-memory payload files, bytes held", "MiB", "info"),
    ("spark_workers_rss_mib", "Spark Python workers, resident (information)", "MiB", "info"),
    ("spark_jvm_rss_mib", "Spark JVM, resident (information)", "MiB", "info"),
)


def trends(samples: Sequence[Sample], warm_up_s: float) -> dict[str, Trend]:
    times = [s.t_s for s in samples]
    return {
        attribute: trend(label, unit, kind, times, [float(getattr(s, attribute)) for s in samples], warm_up_s)
        for attribute, label, unit, kind in MEASURES
    }


def _trend_table(found: dict[str, Trend], warm_up_s: float) -> Table:
    table = Table(
        f"Trends after the warm-up (the first {warm_up_s / 60:.1f} min): least-squares line through "
        "the samples after it",
        [
            "measure",
            "unit",
            "samples",
            "warm-up max",
            "min",
            "max",
            "last",
            "slope per 10 min",
            "rise",
            "flat",
        ],
    )
    for found_trend in found.values():
        table.rows.append(
            {
                "measure": found_trend.measure,
                "unit": found_trend.unit,
                "samples": found_trend.samples,
                "warm-up max": found_trend.warm_up_max,
                "min": found_trend.after_min,
                "max": found_trend.after_max,
                "last": found_trend.last,
                "slope per 10 min": found_trend.slope_per_10_min,
                "rise": found_trend.rise,
                "flat": "info" if found_trend.kind == "info" else found_trend.flat,
            }
        )
    return table


def _jobs_table(jobs: Sequence[JobCheck]) -> Table:
    table = Table(
        "Jobs by model and kind: each checks its rows exactly once "
        "(ids' count, distinct count, min, max, sum)",
        [
            "model",
            "kind",
            "jobs",
            "passed",
            "failed",
            "rows checked",
            "median s",
            "rows/s, median",
            "rows/s, min",
        ],
    )
    groups: dict[tuple[str, str], list[JobCheck]] = {}
    for job in jobs:
        groups.setdefault((job.model, job.kind), []).append(job)
    for (model, kind), group in sorted(groups.items()):
        rates = sorted(j.expected_rows / j.duration_s for j in group if j.passed and j.duration_s > 0)
        durations = sorted(j.duration_s for j in group)
        table.rows.append(
            {
                "model": model,
                "kind": kind,
                "jobs": len(group),
                "passed": sum(j.passed for j in group),
                "failed": sum(j.error is not None for j in group),
                "rows checked": sum(j.rows for j in group),
                "median s": durations[len(durations) // 2],
                "rows/s, median": rates[len(rates) // 2] if rates else None,
                "rows/s, min": rates[0] if rates else None,
            }
        )
    return table


def _flat_target(what: str, found: Sequence[Trend]) -> TargetCheck:
    judged = [t for t in found if t.flat is not None]
    measured = "; ".join(
        f"{t.measure}: {t.warm_up_max:.0f} at most in the warm-up, "
        f"{t.after_min:.0f}-{t.after_max:.0f} after, fitted rise {t.rise:+.2f}"
        for t in found
    )
    met = all(t.flat for t in judged) if len(judged) == len(found) else None
    return TargetCheck(
        f"{what} flat after the warm-up (the fitted line rises less than 1 over the run, or no sample "
        "exceeds the warm-up's highest)",
        measured,
        met,
    )


def _targets(
    found: dict[str, Trend], samples: Sequence[Sample], jobs: Sequence[JobCheck], crashed: Sequence[str]
) -> list[TargetCheck]:
    failed = sum(j.error is not None for j in jobs)
    off = [j for j in jobs if j.error is None and not j.passed]
    restarts = samples[-1].restarts - samples[0].restarts if samples else float("nan")
    pids = sorted({pid for s in samples for pid in s.server_pids})
    targets = [
        TargetCheck(
            "No job fails",
            f"{len(jobs)} jobs, {failed} failed; {len(crashed)} Spark applications crashed",
            bool(jobs) and failed == 0 and not crashed,
        ),
        TargetCheck(
            "0 rows lost or duplicated; every prediction present and of the model's width",
            f"{sum(j.rows for j in jobs if j.error is None):,} rows in {len(jobs) - failed} jobs; "
            f"{len(off)} jobs off (" + (", ".join(f"job {j.index}" for j in off[:5]) or "none") + ")",
            bool(jobs) and not off,
        ),
        TargetCheck(
            "The supervisor restarts no server",
            f"{restarts:.0f} restarts; server pids seen: {', '.join(map(str, pids)) or 'none'}",
            restarts == 0 and len(pids) == 1,
        ),
    ]
    for attribute in ("server_rss_mib", "supervisor_rss_mib"):
        memory = found[attribute]
        targets.append(
            TargetCheck(
                f"{memory.measure.capitalize()} memory flat after the warm-up: slope under "
                f"{MEMORY_SLOPE_LIMIT_MIB_PER_10_MIN:.0f} MiB per 10 min",
                f"{memory.slope_per_10_min:+.2f} MiB per 10 min "
                f"({memory.after_min:,.1f}-{memory.after_max:,.1f} MiB after the warm-up, "
                f"last {memory.last:,.1f})",
                memory.flat,
            )
        )
    targets.append(_flat_target("Open descriptors", [found["server_fds"], found["supervisor_fds"]]))
    targets.append(_flat_target("Threads", [found["server_threads"], found["supervisor_threads"]]))
    targets.append(_flat_target("Shared-memory payload files", [found["shared_memory_files"]]))
    return targets


def _plot(samples: Sequence[Sample], settings: Settings, warm_up_s: float) -> str:
    plot_file = f"{NAME}.png"
    minutes = [s.t_s / 60 for s in samples]

    def series(*attributes: str) -> plots.Series:
        labels = {attribute: label for attribute, label, _, _ in MEASURES}
        return {labels[a]: (minutes, [float(getattr(s, a)) for s in samples]) for a in attributes}

    panels = [
        ("Model server memory", "MiB", series("server_rss_mib", "server_pss_mib")),
        ("Supervisor memory", "MiB", series("supervisor_rss_mib", "supervisor_pss_mib")),
        (
            "Descriptors, threads, shared-memory files",
            "count",
            series(
                "server_fds", "server_threads", "supervisor_fds", "supervisor_threads", "shared_memory_files"
            ),
        ),
        ("Spark (information)", "MiB", series("spark_workers_rss_mib", "spark_jvm_rss_mib")),
    ]
    plots.line_panels(
        results_dir(settings.quick) / plot_file,
        f"{settings.minutes:g} minutes of Spark jobs against one udfserve node",
        panels,
        xlabel="minutes",
        log_x=False,
        columns=2,
        shade_x=(0.0, warm_up_s / 60, "warm-up"),
        marker=".",
    )
    return plot_file


def _result(
    settings: Settings,
    warm_up_s: float,
    samples: list[Sample],
    jobs: list[JobCheck],
    crashed: list[str],
    duration_s: float,
) -> ComparisonResult:
    found = trends(samples, warm_up_s)
    applications = (
        "one Spark application"
        if settings.application_minutes is None
        else (f"a fresh Spark application every {settings.application_minutes:g} minutes")
    )
    method = (
        "One `udfserve node --devices cpu` (the supervisor and one model server) serves `tabular_mlp` "
        f"and `sequence_bilstm` for {settings.minutes:g} minutes of Spark jobs run back to back in "
        f"{applications} (local[2]); the jobs find the server through the node's discovery file, as "
        "executors do, pass their payloads through the node's own shared-memory folder, and fail rather "
        "than fall back to the CPU. "
        f"Jobs cycle over the two models ({settings.rows['tabular_mlp']:,} and "
        f"{settings.rows['sequence_bilstm']:,} rows of parquet, ids 0 to n-1) and the client's three ways "
        "(`remote_predict` as a pandas UDF, `udf_type='arrow'`, `predict_arrow`); each job aggregates its "
        "output in one action: count, distinct ids, least and greatest id, sum of ids, and predictions that "
        f"are null or not of the model's width. Every {settings.sample_s:g} s the script samples the "
        "resident and proportional memory, open descriptors and threads of the model server and of the "
        "supervisor, the payload files of the shared-memory folder (named, or removed and still held open "
        "by the server or a Spark worker: their memory shows in no process's resident size), the "
        "supervisor's restart counter "
        "(`udfserve_server_restarts_total` on its `/metrics`) and the Spark workers' and JVM's memory. "
        f"The first {warm_up_s / 60:.1f} minutes are warm-up (a sixth of the run, or until every model and "
        "kind had finished a job, if that came later); through the samples after it a "
        "least-squares line is fitted: its slope per 10 minutes judges memory, its rise over the run "
        "(or no sample above the warm-up's highest) the counts."
    )
    notes = [
        f"{len(samples)} samples, {len(jobs)} jobs; every sample and every job's check is in the JSON "
        "(`raw.samples`, `raw.jobs`: a list of values per field), from which the tables and the plot can "
        "be drawn again.",
        *[f"Spark {crash[:500]}" for crash in crashed],
    ]
    return ComparisonResult(
        name=NAME,
        title=f"An hour of load: {settings.minutes:g} minutes of Spark jobs against one udfserve node",
        method=method,
        tables=[_jobs_table(jobs), _trend_table(found, warm_up_s)],
        targets=_targets(found, samples, jobs, crashed),
        notes=notes,
        plot_file=_plot(samples, settings, warm_up_s),
        raw={
            "settings": asdict(settings),
            "warm_up_s": warm_up_s,
            "samples": by_field(samples),
            "jobs": by_field(jobs),
            "trends": {attribute: asdict(t) for attribute, t in found.items()},
        },
        duration_s=duration_s,
    )


def by_field(records: Sequence[Sample] | Sequence[JobCheck]) -> dict[str, list[Any]]:
    """Records as one list per field: an hour's jobs and samples in a fraction of the JSON that a
    list of objects, each field on a line of its own, would take."""
    rows = [asdict(record) for record in records]
    return {name: [row[name] for row in rows] for name in (rows[0] if rows else {})}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser)
    parser.add_argument("--minutes", type=float, help="how long the jobs run (default 60; 0.2 with --quick)")
    parser.add_argument("--sample-s", type=float, help="seconds between samples (default 30; 1 with --quick)")
    parser.add_argument(
        "--application-minutes",
        type=float,
        help="start a fresh Spark application this often (default: one application for the whole run)",
    )
    args = parser.parse_args(argv)
    configure_logging()
    settings = Settings.make(args.quick)
    chosen = {
        "minutes": args.minutes,
        "sample_s": args.sample_s,
        "application_minutes": args.application_minutes,
    }
    settings = replace(settings, **{k: v for k, v in chosen.items() if v is not None})
    with Workspace() as workspace:
        result = run_soak(workspace, settings)
    return write_and_print(result, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
