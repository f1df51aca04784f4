"""Comparison 1, end-to-end Spark: the same DataFrame through udfserve and through the in-worker
recipes, local mode with two cores, the tabular MLP and the sequence model.

    python -m benchmarks.spark_e2e [--quick]

Each contender runs as its own Spark application (``benchmarks.spark_job``): a fresh driver, JVM
and Python workers, reading the same parquet files and writing to Spark's ``noop`` sink. The job
runs three times in its application: the first run pays the workers' start (and, in the worker,
TensorFlow's import and the model's load); the fastest later run is quoted as rows/s (per job).
udfserve's paths also measure their steady rate as Ray Data's is measured: a job over the files
``LONG_PASSES`` times over runs between each two of their runs (``Job.long_passes``), and its
extra rows over its extra time leave out Spark's fixed costs of a job. Every contender's
application runs twice, in two rounds of opposite order, and the faster application is quoted.
The resident memory of the Spark Python workers is sampled every 50 ms over all runs, and the
highest peak of the two rounds is quoted.

Where ``ray`` is installed (the ``bench-ray`` extra), Ray Data runs in the same rounds on the same
files and model (``benchmarks.ray_contender``): the alternative to Spark teams weigh for batch
inference. Without it the comparison runs without Ray and its notes say how to add it.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import psutil

from benchmarks import plots, ray_contender
from benchmarks.cli import main_for, results_dir
from benchmarks.processes import LOGS_DIR, PeakRssSampler, Workspace
from benchmarks.ray_job import CONTENDER as RAY
from benchmarks.ray_job import RayJobResult
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.spark_job import MODEL_LESS, MODELS, Job, JobResult, run_in_child, write_dataset
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)

NAME = "spark_e2e"
LABELS = {
    "remote_predict": "1a remote_predict (udfserve, pandas UDF)",
    "remote_predict_arrow": "1a remote_predict, udf_type='arrow' (udfserve, Arrow UDF)",
    "predict_arrow": "1a predict_arrow (udfserve, mapInArrow)",
    "predict_files": "1a predict_files (udfserve, files read in the Python workers)",
    "predict_batch_udf": "1b predict_batch_udf (model in worker)",
    "cached_pandas_udf": "1c pandas UDF, model cached per worker",
    "load_per_batch": "1d pandas UDF, model loaded per batch (small run)",
    "passthrough": "pandas UDF without a model (ceiling)",
    "passthrough_arrow": "mapInArrow without a model (ceiling)",
    RAY: ray_contender.LABEL,
}
CORES = len(os.sched_getaffinity(0))
TUNED = "predict_files_tuned"
"""``predict_files`` against a second server tuned for throughput on this CPU: as many concurrent
model calls as cores (``--inference-threads``), as a user tunes Ray Data's pool (by default a
server makes one backend call per model at a time, which leaves the other cores to Spark)."""
TUNED_SERVER_ARGS = ("--inference-threads", str(CORES))
TUNED_IN_FLIGHT = 8
"""The tuned contender's ``max_in_flight`` (the client's default is 4): with two calls at a time in
the server, four requests in flight left it waiting for the next one (400k against 500k rows/s at
steady on the tabular model, one trial)."""
LABELS[TUNED] = (
    f"1a predict_files, --inference-threads {CORES}, max_in_flight={TUNED_IN_FLIGHT} "
    "(udfserve, tuned for throughput)"
)
REMOTE_CONTENDERS = ("remote_predict", "remote_predict_arrow", "predict_arrow", "predict_files", TUNED)
TARGET_NAMES = {
    "remote_predict": "remote_predict",
    "remote_predict_arrow": "remote_predict(udf_type='arrow')",
    "predict_arrow": "predict_arrow",
    "predict_files": "predict_files",
    TUNED: f"predict_files (--inference-threads {CORES}, max_in_flight={TUNED_IN_FLIGHT})",
}
MAIN_CONTENDERS = (*REMOTE_CONTENDERS, "predict_batch_udf", "cached_pandas_udf", *MODEL_LESS)
TARGET_SPEED_RATIO = 1.0
TARGET_MEMORY_OVER_FLOOR = 1.10
"""The Python workers of a udfserve UDF hold at most this much of what a UDF of the same kind
(pandas or Arrow) holds with no model and no client: the floor a client can be judged on."""
FLOOR_OF = {
    "remote_predict": "passthrough",
    "remote_predict_arrow": "passthrough_arrow",
    "predict_arrow": "passthrough_arrow",
}
"""``predict_files`` has none: its workers read the parquet files, which no model-less contender's
do (the JVM reads them for the floors), so its memory is reported beside the Arrow floor, not judged."""


@dataclass(frozen=True)
class Settings:
    quick: bool
    rows: dict[str, int]
    small_rows: int
    files: int
    runs: int
    rounds: int
    """Each contender's application runs once per round; rounds alternate the contenders' order."""
    long_passes: int
    """udfserve's paths: the passes over the files of the long jobs between their runs."""

    @property
    def remote_runs(self) -> int:
        """udfserve's paths' runs over the files, a long job between each two: at least two, the
        quick mode's first run being cold."""
        return max(self.runs, 2)

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(
                quick,
                {"tabular_mlp": 40_000},
                small_rows=8_192,
                files=2,
                runs=1,
                rounds=1,
                long_passes=ray_contender.QUICK_LONG_PASSES,
            )
        return cls(
            quick,
            {"tabular_mlp": 500_000, "sequence_bilstm": 50_000},
            small_rows=32_768,
            files=4,
            runs=3,
            rounds=2,
            long_passes=ray_contender.LONG_PASSES,
        )


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the Spark runs are not sampled."""
    settings = Settings.make(quick)
    started = time.perf_counter()
    models = list(settings.rows)
    repository = workspace.repository("spark", {model: {} for model in models})
    server = workspace.start_server(repository, "spark")
    tuned = workspace.start_server(repository, "spark-tuned", TUNED_SERVER_ARGS)
    results: dict[str, dict[str, JobResult]] = {}
    ray_sweeps: dict[str, list[RayJobResult]] = {}
    server_process = psutil.Process(server.pid)
    with PeakRssSampler(lambda: [server_process], interval_s=0.2) as server_memory:
        for model in models:
            data = workspace.path(f"data-{model}")
            write_dataset(data, model, settings.rows[model], settings.files)
            small = workspace.path(f"small-{model}")
            write_dataset(small, model, settings.small_rows, 1)
            # The quick run only checks the scripts: the model-less ceilings are left out.
            entries = [c for c in MAIN_CONTENDERS if not (settings.quick and c in MODEL_LESS)]
            entries += [RAY] if ray_contender.available() else []
            rounds: dict[str, list[JobResult]] = {entry: [] for entry in entries}
            job_of = functools.partial(_job, workspace, {"": server, TUNED: tuned}, repository, model)
            ray_rounds: list[RayJobResult] = []
            ray_round = functools.partial(
                _ray_round, workspace, repository, model, data, settings, ray_rounds
            )
            # A neighbour's burst lands on whichever contender runs at the time: each round runs
            # the contenders in the other order, so none always runs first or last.
            for round_index in range(settings.rounds):
                for entry in entries if round_index % 2 == 0 else entries[::-1]:
                    logger.info("spark: %s on %s, round %d", entry, model, round_index + 1)
                    if entry == RAY:
                        ran = ray_round()
                        if round_index == 0:
                            ray_sweeps[model] = ran
                        continue
                    rounds[entry].append(run_in_child(job_of(entry, data, settings, str(round_index))))
            results[model] = {entry: best_of(runs) for entry, runs in rounds.items() if entry != RAY}
            if ray_rounds:
                results[model][RAY] = ray_contender.best_of(ray_rounds)
            if model == "tabular_mlp":
                # The anti-pattern is slow enough to need no second round, and a small data set.
                logger.info("spark: load_per_batch on %s", model)
                results[model]["load_per_batch"] = run_in_child(
                    job_of("load_per_batch", small, replace(settings, runs=1), "small")
                )
    workspace.stop_server(server)
    workspace.stop_server(tuned)
    return _result(
        results, ray_sweeps, server_memory.peak_total_bytes / 2**20, settings, time.perf_counter() - started
    )


def _ray_results(results: dict[str, dict[str, JobResult]]) -> dict[str, RayJobResult]:
    """Ray Data's result of each model where it ran."""
    found = {}
    for model, by_contender in results.items():
        result = by_contender.get(RAY)
        if isinstance(result, RayJobResult):
            found[model] = result
    return found


def _ray_round(
    workspace: Workspace,
    repository: Path,
    model: str,
    data: Path,
    settings: Settings,
    rounds: list[RayJobResult],
) -> list[RayJobResult]:
    """Ray Data's turn in a round: the sweep in the first, its best setting again in later ones;
    the round's best goes to ``rounds``, and the applications it ran are returned."""
    swept = [(rounds[0].pool_size, rounds[0].batch_size)] if rounds else None
    best, ran = ray_contender.run_round(
        workspace,
        model,
        data,
        str(repository / model / "1" / "model.keras"),
        settings.quick,
        swept or ray_contender.sweep_settings(settings.quick),
    )
    rounds.append(best)
    return ran


def _job(
    workspace: Workspace,
    servers: Mapping[str, ServerProcess],
    repository: Path,
    model: str,
    contender: str,
    data: Path,
    settings: Settings,
    tag: str,
) -> Job:
    """One application of ``contender`` (its server in ``servers``, else ``servers[""]``): ``tag``
    keeps its model-load markers apart from others'.
    udfserve's paths alternate their runs with long jobs, to measure their steady rate."""
    remote = contender in REMOTE_CONTENDERS
    server = servers.get(contender, servers[""])
    return Job(
        contender="predict_files" if contender == TUNED else contender,
        model=model,
        data=str(data),
        model_file=str(repository / model / "1" / "model.keras"),
        address=server.grpc_target(),
        server_pid=server.pid,
        marker_dir=str(workspace.path(f"loads-{model}-{contender}-{tag}")),
        runs=settings.remote_runs if remote else settings.runs,
        long_passes=settings.long_passes if remote else 0,
        log_file=str(LOGS_DIR / f"spark-{model}-{contender}.log"),
        client_settings={"max_in_flight": TUNED_IN_FLIGHT} if contender == TUNED else {},
    )


def best_of(rounds: list[JobResult]) -> JobResult:
    """One contender over its rounds: the application with the fastest job after the first, with
    the highest memory peaks and model loads of any round (a peak is a peak whenever it happened)
    and the steady rate and its CPU of the round with the best steady rate (as Ray Data's)."""
    fastest = max(rounds, key=rows_per_s)
    steadiest = max(rounds, key=lambda result: result.steady_rows_s)
    return replace(
        fastest,
        steady_rows_s=steadiest.steady_rows_s,
        steady_cpu_s_per_million_rows=steadiest.steady_cpu_s_per_million_rows,
        rounds_steady_rows_s=[r.steady_rows_s for r in rounds],
        peak_worker_rss_total_mib=max(r.peak_worker_rss_total_mib for r in rounds),
        peak_worker_rss_single_mib=max(r.peak_worker_rss_single_mib for r in rounds),
        peak_worker_pss_total_mib=max(r.peak_worker_pss_total_mib for r in rounds),
        peak_jvm_rss_mib=max(r.peak_jvm_rss_mib for r in rounds),
        model_loads_in_workers=max(r.model_loads_in_workers for r in rounds),
        rounds_rows_s=[rows_per_s(r) for r in rounds],
    )


def rows_per_s(result: JobResult) -> float:
    """Per job: the best run after the first, which pays the workers' start."""
    return result.rows / result.runs_s[result.best_run]


def _max_difference(result: JobResult, reference: JobResult) -> float:
    shared = [key for key in result.sample if key in reference.sample]
    if not shared:
        return float("nan")
    return max(
        float(np.max(np.abs(np.asarray(result.sample[k]) - np.asarray(reference.sample[k])))) for k in shared
    )


def _model_table(model: str, results: dict[str, JobResult], settings: Settings) -> Table:
    reference = results["cached_pandas_udf"]
    batch_udf = rows_per_s(results["predict_batch_udf"])
    cached = rows_per_s(reference)
    table = Table(
        f"{model}: {settings.rows[model]:,} rows of {MODELS[model][1]} floats, local[2], noop sink",
        [
            "contender",
            "rows",
            "partitions",
            "rows/s",
            "rows/s by round",
            "steady rows/s",
            "÷ 1b",
            "÷ 1c",
            "first run s",
            "peak RSS, all Python workers MiB",
            "peak RSS, one worker MiB",
            "peak PSS, all Python workers MiB",
            "model loads in workers",
            "max |Δ| vs 1c",
        ],
    )
    for contender, result in results.items():
        speed = rows_per_s(result)
        table.rows.append(
            {
                "contender": LABELS[contender],
                "rows": result.rows,
                "partitions": result.partitions,
                "rows/s": speed,
                "rows/s by round": " / ".join(f"{r:,.0f}" for r in result.rounds_rows_s) or "-",
                "steady rows/s": result.steady_rows_s or None,
                "÷ 1b": speed / batch_udf,
                "÷ 1c": speed / cached,
                "first run s": result.runs_s[0],
                "peak RSS, all Python workers MiB": result.peak_worker_rss_total_mib,
                "peak RSS, one worker MiB": result.peak_worker_rss_single_mib,
                "peak PSS, all Python workers MiB": result.peak_worker_pss_total_mib,
                "model loads in workers": result.model_loads_in_workers,
                "max |Δ| vs 1c": None if contender in MODEL_LESS else _max_difference(result, reference),
            }
        )
    return table


CPU_GROUPS = ("Python workers", "JVM", "model server")


def _cpu_table(results: dict[str, dict[str, JobResult]]) -> Table:
    """Where the two cores went in the last run: CPU seconds per million rows by process group."""
    ray_groups = ray_contender.CPU_GROUPS if any(RAY in by for by in results.values()) else ()
    table = Table(
        "CPU seconds per million rows in the run quoted, by process (two cores: at most 2 CPU-s per second)",
        ["model", "contender", *CPU_GROUPS, *ray_groups, "total", "cores busy"],
    )
    for model, by_contender in results.items():
        for contender, result in by_contender.items():
            if not result.runs_cpu_s:
                continue
            cpu_s = result.runs_cpu_s[result.best_run]
            groups = ray_groups if contender == RAY else CPU_GROUPS
            per_million = {g: cpu_s.get(g, 0.0) / result.rows * 1e6 for g in groups}
            total = sum(cpu_s.values())
            table.rows.append(
                {
                    "model": model,
                    "contender": LABELS[contender].split(" (")[0],
                    **per_million,
                    "total": sum(per_million.values()),
                    "cores busy": total / result.runs_s[result.best_run],
                }
            )
    return table


def _steady_cpu_table(results: dict[str, dict[str, JobResult]]) -> Table | None:
    """Where the cores go at the steady rate: the long job's CPU less the short job's, over the
    extra rows; for the contenders whose steady rate was measured (None: none was)."""
    measured = [
        (m, c, r) for m, by in results.items() for c, r in by.items() if r.steady_cpu_s_per_million_rows
    ]
    if not measured:
        return None
    ray_groups = ray_contender.CPU_GROUPS if any(c == RAY for _, c, _ in measured) else ()
    table = Table(
        # not "CPU seconds ...": benchmarks.cluster_model finds the per-job table by that prefix
        "At the steady rate: CPU seconds per million rows by process (the long job's CPU less the short "
        "job's, over the extra rows); *cores busy* is the total times the rate, which two cores bound: "
        "a pair of runs that shows more than 2 was disturbed",
        ["model", "contender", *CPU_GROUPS, *ray_groups, "total", "steady rows/s", "cores busy"],
    )
    for model, contender, result in measured:
        per_million = result.steady_cpu_s_per_million_rows
        table.rows.append(
            {
                "model": model,
                "contender": LABELS[contender].split(" (")[0],
                **{g: per_million.get(g, 0.0) for g in (ray_groups if contender == RAY else CPU_GROUPS)},
                "total": sum(per_million.values()),
                "steady rows/s": result.steady_rows_s,
                "cores busy": sum(per_million.values()) * result.steady_rows_s / 1e6,
            }
        )
    return table


def _best(by_contender: dict[str, JobResult], rate: Callable[[JobResult], float]) -> tuple[str, float]:
    """udfserve's fastest Spark path by ``rate``, under its target name, and that rate."""
    contender = max(REMOTE_CONTENDERS, key=lambda c: rate(by_contender[c]))
    return TARGET_NAMES[contender], rate(by_contender[contender])


def _targets(results: dict[str, dict[str, JobResult]]) -> list[TargetCheck]:
    targets = []
    ray_results = _ray_results(results)
    # per job against Ray's per job, steady against Ray's steady: each path's best of each kind
    targets += ray_contender.targets(
        {m: _best(by, rows_per_s) for m, by in results.items()},
        {m: _best(by, lambda result: result.steady_rows_s) for m, by in results.items()},
        ray_results,
    )
    for model, by_contender in results.items():
        batch_udf = rows_per_s(by_contender["predict_batch_udf"])
        cached = rows_per_s(by_contender["cached_pandas_udf"])
        for contender in REMOTE_CONTENDERS:
            speed = rows_per_s(by_contender[contender])
            ratio = min(speed / batch_udf, speed / cached)
            targets.append(
                TargetCheck(
                    f"{model}: {TARGET_NAMES[contender]} at least {TARGET_SPEED_RATIO:.1f}x the rows/s "
                    "of 1b and 1c",
                    f"{speed / batch_udf:.2f}x 1b, {speed / cached:.2f}x 1c",
                    ratio >= TARGET_SPEED_RATIO,
                )
            )
        reference_mib = by_contender["predict_batch_udf"].peak_worker_rss_total_mib
        for contender in REMOTE_CONTENDERS:
            floor = FLOOR_OF.get(contender, "")
            if floor not in by_contender:  # no floor of its kind, or the quick mode's: no model-less UDF
                continue
            result, floor_result = by_contender[contender], by_contender[floor]
            over = result.peak_worker_rss_total_mib / floor_result.peak_worker_rss_total_mib
            targets.append(
                TargetCheck(
                    f"{model}: Python workers of {TARGET_NAMES[contender]} within "
                    f"{TARGET_MEMORY_OVER_FLOOR - 1:.0%} of the resident memory of the same kind of UDF "
                    f"without a model (its floor: {LABELS[floor].split(' (')[0]})",
                    f"{over:.2f}x its floor ({result.peak_worker_rss_total_mib:,.0f} vs "
                    f"{floor_result.peak_worker_rss_total_mib:,.0f} MiB, all workers at their peak); "
                    f"{result.peak_worker_rss_total_mib / reference_mib:.3f} of 1b's",
                    over <= TARGET_MEMORY_OVER_FLOOR,
                )
            )
            pss_over = result.peak_worker_pss_total_mib / floor_result.peak_worker_pss_total_mib
            targets.append(
                TargetCheck(
                    f"{model}: the same, with shared pages counted once (proportional set size)",
                    f"{pss_over:.2f}x its floor ({result.peak_worker_pss_total_mib:,.0f} vs "
                    f"{floor_result.peak_worker_pss_total_mib:,.0f} MiB)",
                    pss_over <= TARGET_MEMORY_OVER_FLOOR,
                )
            )
    return targets


def _floor_notes(results: dict[str, dict[str, JobResult]]) -> list[str]:
    """What the Python workers of a UDF without a model hold, next to the memory target."""
    notes = []
    for model, by_contender in results.items():
        if not all(c in by_contender for c in MODEL_LESS):
            continue
        reference_mib = by_contender["predict_batch_udf"].peak_worker_rss_total_mib
        pandas_mib, arrow_mib = (by_contender[c].peak_worker_rss_total_mib for c in MODEL_LESS)
        notes.append(
            f"{model}: with no model and no client at all, the Python workers of a pandas UDF peak at "
            f"{pandas_mib / reference_mib:.3f} of 1b's resident memory ({pandas_mib:,.0f} MiB) and those "
            f"of a `mapInArrow` function at {arrow_mib / reference_mib:.3f} ({arrow_mib:,.0f} MiB): the "
            "floor of each kind of UDF here, which the memory targets are judged against."
        )
        if "predict_files" in by_contender:
            files_mib = by_contender["predict_files"].peak_worker_rss_total_mib
            notes.append(
                f"{model}: the Python workers of `predict_files` peak at {files_mib:,.0f} MiB, "
                f"{files_mib / arrow_mib:.2f}x the `mapInArrow` floor: they read the parquet files "
                "themselves (the floor's workers receive rows Spark's reader read in the JVM), so no "
                "contender here is their floor and no memory target judges them."
            )
    return notes


def _result(
    results: dict[str, dict[str, JobResult]],
    ray_sweeps: dict[str, list[RayJobResult]],
    server_peak_mib: float,
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    tables = [_model_table(model, by_contender, settings) for model, by_contender in results.items()]
    tables.append(_cpu_table(results))
    steady_cpu = _steady_cpu_table(results)
    tables += [steady_cpu] if steady_cpu else []
    ray_results = _ray_results(results)
    if ray_results:
        tables += [ray_contender.sweep_table(ray_sweeps), ray_contender.memory_table(ray_results)]
    plot_file = f"{NAME}.png"
    panels = []
    for model, by_contender in results.items():
        speeds = {LABELS[c].split(" (")[0]: rows_per_s(r) for c, r in by_contender.items()}
        for contender, result in by_contender.items():
            if result.steady_rows_s:
                name = "Ray Data" if contender == RAY else LABELS[contender].split(" (")[0]
                speeds[f"{name}, steady (fixed costs out)"] = result.steady_rows_s
        panels.append((f"{model}: rows/s", "rows/s", speeds))
    first = next(iter(results.values()))
    panels.append(
        (
            f"{next(iter(results))}: peak RSS of all Python workers",
            "MiB",
            {LABELS[c].split(" (")[0]: r.peak_worker_rss_total_mib for c, r in first.items()},
        )
    )
    plots.bar_panels(results_dir(settings.quick) / plot_file, "End-to-end Spark, local[2]", panels)
    method = (
        "Each contender is its own Spark application (local[2], Arrow batches of 16,384 rows: "
        "`spark.sql.execution.arrow.maxRecordsPerBatch` and `spark.sql.parquet.columnarReaderBatchSize`), "
        f"reading the same parquet files ({settings.files} files, an `id` and the model's input as a flat "
        "`array<float>`) and writing to the `noop` sink. "
        + (
            f"Each job runs {settings.runs} times in its application: rows/s is the fastest run after the "
            "first (the one least disturbed by other work on the machine), *first run* includes the workers' "
            "start and, in the worker, importing TensorFlow and loading the model. "
            f"Each contender's application runs {settings.rounds} times, in rounds of alternating order "
            "(a b c d e, e d c b a): rows/s, first run and CPU are those of the faster application "
            "(*rows/s by round* lists both), the memory peaks the highest of any round. "
            if settings.runs > 1
            else "Each job runs once (quick mode): rows/s includes the workers' start. "
        )
        + "udfserve's paths (1a) are also measured as Ray Data is, for their *steady rows/s*: their "
        f"application runs {settings.remote_runs} jobs over the files and, between each two, one job over "
        f"the same files {settings.long_passes} times over (hard links in one folder), so its runs are "
        "short, long, short, ...; "
        + (
            "their rows/s is the fastest short job after the first, as for the others; "
            if settings.runs > 1
            else "their rows/s is that of their second short job; "
        )
        + "*steady rows/s* is the long job's extra rows over its extra time (the fastest long job against "
        "the fastest short one after the first), with Spark's fixed costs of a job (planning it, scheduling "
        "its tasks, the JVM's work per job) left out, and its CPU per million rows the long job's CPU less "
        "the short job's over the extra rows. "
        + (
            "Rows/s and first run are those of the application with the fastest job, the steady rate that "
            "of the application with the best steady rate (as Ray Data's). "
            if settings.rounds > 1
            else ""
        )
        + "The other contenders run no long jobs. "
        "`predict_files` scores the same files without Spark's reader: each task reads its file (or its "
        "group of row groups) with pyarrow in the Python worker and streams it to the server, Spark "
        "receiving only the `id` and the prediction; its application checks that every id came back "
        "exactly once (as often as read, in the long jobs). "
        f"*predict_files, --inference-threads {CORES}, max_in_flight={TUNED_IN_FLIGHT}* is the same "
        f"against a second server started with `--inference-threads {CORES}` (as many concurrent model "
        "calls as cores, each in TensorFlow's one-core-short intra-op pool; by default a server makes "
        f"one call per model at a time) and with {TUNED_IN_FLIGHT} requests in flight per task instead "
        "of 4: the settings a user tunes for throughput on a CPU node, as Ray Data's pool is swept; the "
        "other 1a contenders call the default server with the client's defaults. "
        + "1a calls one model server (the example models, started before the runs) over its unix socket with "
        "the client's defaults (4,096 rows per request but at most 2 MiB of input: 4,096 rows of the "
        "tabular model, 1,024 of the sequence model; 4 in flight). The in-worker contenders call the "
        "Keras model through a `tf.function` (their fastest path, not `model.predict`); 1b uses "
        "`predict_batch_udf` with batch_size 4,096, 1c an iterator pandas UDF with the model cached in an "
        "importable module. 1d loads the model for every batch and runs on a small data set. The server "
        "calls the model on up to `max_batch_size` rows at once (4,096 for the tabular model and for the "
        "sequence model in the example configs). The peak "
        "resident memory of the `pyspark.daemon` process and the workers it forks is sampled every 50 ms "
        "over an application's jobs, 1a's long ones left out as the other contenders run none (summed, "
        "and the largest one), and "
        "their proportional set size every 0.25 s (*PSS*: a page "
        "the daemon shares with the workers it forked counted once, not once per process as the sum of "
        "resident sizes counts it). *max |Δ|* compares the first rows' predictions with 1c's."
        + (" " + ray_contender.METHOD if ray_results else "")
    )
    notes = [
        f"The default model server that 1a calls peaked at {server_peak_mib:,.0f} MiB resident: it holds "
        "TensorFlow "
        "and the models once for the node, where each in-worker Python worker holds its own copy.",
        "Everything shares two cores: the JVM, the Python workers and, for 1a, the model server.",
        *_floor_notes(results),
        *(
            []
            if ray_results
            else [
                f"Ray Data was not measured: `ray` is not installed here ({ray_contender.INSTALL} adds it)."
            ]
        ),
    ]
    return ComparisonResult(
        name=NAME,
        title="End-to-end Spark: udfserve vs the model in the worker",
        method=method,
        tables=tables,
        targets=_targets(results),
        notes=notes,
        plot_file=plot_file,
        raw={
            "results": {m: {c: asdict(r) for c, r in by.items()} for m, by in results.items()},
            "server_peak_rss_mib": server_peak_mib,
            "ray_sweeps": {m: [asdict(r) for r in sweep] for m, sweep in ray_sweeps.items()},
        },
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
