"""Comparison 4, executor footprint: model loads on a node as the tasks grow, the Python workers'
resident memory and start-up on the remote path against in-process TensorFlow, and where a remote
worker's memory goes.

    python -m benchmarks.footprint [--quick]

A Spark application per (contender, number of tasks), local[2], over a DataFrame Spark makes in
exactly that many partitions; model loads in the workers are counted by the loaders themselves,
and the server's by its ``udfserve_model_loads_total`` metric.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.processes import LOGS_DIR, Workspace, metric_value, scrape
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.spark_job import Job, JobResult, run_in_child
from benchmarks.startup_probe import probe_in_child

logger = logging.getLogger(__name__)

NAME = "footprint"
MODEL = "tabular_mlp"
SEQUENCE_MODEL = "sequence_bilstm"
LABELS = {
    "remote_predict": "remote_predict (udfserve)",
    "predict_batch_udf": "predict_batch_udf (model in worker)",
    "cached_pandas_udf": "pandas UDF, model cached per worker",
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    tasks: tuple[int, ...]
    contenders: tuple[str, ...]
    rows_per_task: int
    memory_batches: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick, (1, 4), ("remote_predict",), 2048, memory_batches=5)
        return cls(quick, (1, 4, 16), tuple(LABELS), 4096, memory_batches=30)


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; memory is broken down by the probe instead."""
    settings = Settings.make(quick)
    started = time.perf_counter()
    repository = workspace.repository("footprint", {MODEL: {}, SEQUENCE_MODEL: {}})
    server = workspace.start_server(repository, "footprint")
    model_file = repository / MODEL / "1" / "model.keras"
    runs: list[dict[str, Any]] = []
    for tasks in settings.tasks:
        for contender in settings.contenders:
            logger.info("footprint: %s with %d tasks", contender, tasks)
            before = metric_value(scrape(server), "udfserve_model_loads_total", model=MODEL)
            job = Job(
                contender=contender,
                model=MODEL,
                synthetic_rows=tasks * settings.rows_per_task,
                partitions=tasks,
                model_file=str(model_file),
                address=server.grpc_target(),
                marker_dir=str(workspace.path(f"loads-{contender}-{tasks}")),
                log_file=str(LOGS_DIR / f"footprint-{contender}-{tasks}.log"),
            )
            result = run_in_child(job)
            after = metric_value(scrape(server), "udfserve_model_loads_total", model=MODEL)
            runs.append(
                {
                    "tasks": tasks,
                    "contender": contender,
                    "server_loads_during": after - before,
                    "server_loads_total": after,
                    "result": result,
                }
            )
    memory = {}
    for model, width in ((MODEL, 64), (SEQUENCE_MODEL, 16 * 32)):
        logger.info("footprint: memory of a remote worker calling %s, step by step", model)
        memory[model] = probe_in_child(
            [
                "udf-memory",
                "--target",
                server.grpc_target(),
                "--model",
                model,
                "--width",
                str(width),
                "--batches",
                str(settings.memory_batches),
            ]
        )
    server_loads = metric_value(scrape(server), "udfserve_model_loads_total", model=MODEL)
    workspace.stop_server(server)
    return _result(runs, memory, server_loads, settings, time.perf_counter() - started)


def _loads(run: dict[str, Any]) -> int:
    result: JobResult = run["result"]
    if run["contender"] == "remote_predict":
        return int(run["server_loads_during"])
    return result.model_loads_in_workers


def _result(
    runs: list[dict[str, Any]],
    memory: dict[str, dict[str, Any]],
    server_loads: float,
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    loads_table = Table(
        f"Model loads on the node as the tasks grow ({settings.rows_per_task:,} rows per task, local[2])",
        [
            "tasks",
            "contender",
            "model loads during the job",
            "Python processes (daemon included)",
            "peak RSS, one worker MiB",
            "peak RSS, all workers MiB",
            "job s (workers' start included)",
        ],
    )
    for run in runs:
        result: JobResult = run["result"]
        loads_table.rows.append(
            {
                "tasks": run["tasks"],
                "contender": LABELS[run["contender"]],
                "model loads during the job": (
                    f"{_loads(run)} (server; {run['server_loads_total']:.0f} since it started)"
                    if run["contender"] == "remote_predict"
                    else f"{_loads(run)} (workers)"
                ),
                "Python processes (daemon included)": result.python_workers_seen,
                "peak RSS, one worker MiB": result.peak_worker_rss_single_mib,
                "peak RSS, all workers MiB": result.peak_worker_rss_total_mib,
                "job s (workers' start included)": result.runs_s[0],
            }
        )
    memory_table = Table(
        "Where a remote worker's resident memory goes: a fresh interpreter running remote_predict's worker "
        "function step by step, batches of 16,384 rows (MiB)",
        ["step", *(f"{model}: resident" for model in memory), *(f"{model}: added" for model in memory)],
    )
    first = next(iter(memory.values()))
    previous: dict[str, float] = {}
    for index, step in enumerate(first["steps_mib"]):
        row: dict[str, Any] = {"step": step}
        for model, probe in memory.items():
            mib = list(probe["steps_mib"].values())[index]
            row[f"{model}: resident"] = mib
            row[f"{model}: added"] = mib - previous[model] if model in previous else None
            previous[model] = mib
        memory_table.rows.append(row)
    memory_table.rows.append(
        {"step": "peak", **{f"{model}: resident": probe["rss_peak_mib"] for model, probe in memory.items()}}
    )
    remote_runs = [r for r in runs if r["contender"] == "remote_predict"]
    targets = [
        TargetCheck(
            "exactly one model load per server process, whatever the number of tasks",
            f"{server_loads:.0f} load(s) of {MODEL} in the server after jobs of "
            f"{', '.join(str(r['tasks']) for r in remote_runs)} tasks; "
            f"{sum(_loads(r) for r in remote_runs)} during them; none in the workers",
            server_loads == 1
            and all(_loads(r) == 0 and r["result"].model_loads_in_workers == 0 for r in remote_runs),
        )
    ]
    plot_file = f"{NAME}.png"
    plots.line_panels(
        results_dir(settings.quick) / plot_file,
        "Executor footprint, local[2]",
        [
            (
                "model loads on the node during the job",
                "loads",
                {
                    LABELS[c]: (
                        list(settings.tasks),
                        [_loads(r) for r in runs if r["contender"] == c],
                    )
                    for c in settings.contenders
                },
            ),
            (
                "peak resident memory, one Python worker",
                "MiB",
                {
                    LABELS[c]: (
                        list(settings.tasks),
                        [r["result"].peak_worker_rss_single_mib for r in runs if r["contender"] == c],
                    )
                    for c in settings.contenders
                },
            ),
        ],
        xlabel="tasks",
    )
    method = (
        "One Spark application per contender and number of tasks (local[2], Python workers reused as Spark "
        f"does by default), over `spark.range` rows with 64 random floats made in exactly that many "
        "partitions, written to the `noop` sink. The in-worker loaders record each load; the server's "
        "loads come from its metrics, scraped before and after each job (one server for the whole "
        "comparison, started before it). The memory breakdown runs the worker function of "
        f"`remote_predict` in a fresh interpreter, over {settings.memory_batches} batches of 16,384 rows fed "
        "as Spark feeds an iterator pandas UDF (rows of 64 floats for tabular_mlp, 512 for sequence_bilstm), "
        "with the client's defaults (4,096 rows per request, 4 in flight); each step's resident memory is "
        "read after it, the peak is the process's high-water mark. Fresh-worker "
        "start-up and memory against in-process TensorFlow, outside Spark, are in the cold-start comparison."
    )
    return ComparisonResult(
        name=NAME,
        title="Executor footprint: model loads, worker memory",
        method=method,
        tables=[loads_table, memory_table],
        targets=targets,
        plot_file=plot_file,
        raw={
            "runs": [
                {**{k: v for k, v in r.items() if k != "result"}, "result": asdict(r["result"])} for r in runs
            ],
            "remote_worker_memory": memory,
            "server_loads_total": server_loads,
        },
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
