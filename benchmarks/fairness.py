"""Comparison: two Spark applications sharing one server, first in first out against fair shares.

    python -m benchmarks.fairness [--quick]

A busy application (16 streams) and a small one (2 streams) load one model of one server, each
from a client process of its own that names its application in the streams' metadata, as the
Spark client does. Each application's rows/s is measured alone, then both together over the same
window (both clients start their timed run at one wall-clock time). Two servers are up, one with
``--application-scheduling fifo`` (one queue in arrival order, as before fair shares) and one with
``fair`` (the default); the cells of each mode are measured in alternating order so that what else
the machine runs lands on both.

The targets: together, the small application keeps at least 0.45x its rate alone under fair
shares (half the server is a fair share for one of two); the total rows/s of both stays within 5%
of first in first out's.

Then the same with two real Spark applications (``--no-spark`` leaves them out): each its own driver process,
``predict_arrow`` on ``sequence_bilstm`` (a model heavy enough per row that the server, not Spark, bounds the
rows/s), the busy one with 2 tasks of 16 requests in flight each, the small one with 1 task of 2; once both
are warm, their timed jobs start together, and the small one's ends before the busy one's, so that it runs
entirely beside it. The servers run on one CPU and the applications on the others (``cpus_apart``), as a
GPU node's device is apart from its executors' CPUs.

``--quick`` checks that the script works: one round of short cells, the load cells on
``tabular_mlp``'s ONNX copy (``tabular_mlp_onnx``, the same weights), and only the two Spark
applications together, under fair shares.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cli import add_common_arguments, configure_logging, write_and_print
from benchmarks.load_client import LoadSpec, finish, start_in_child
from benchmarks.processes import LOGS_DIR, Workspace, scrape
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.spark_job import Job, JobResult, run_in_child
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)

NAME = "fairness"
MODEL = "tabular_mlp"
QUICK_MODEL = "tabular_mlp_onnx"
"""The quick mode's model of the load cells: ``MODEL``'s ONNX copy (same weights, same batching
settings), which spares each of the two servers TensorFlow's import (about 5 of its 6 CPU-seconds
of start); the scheduling compared is the server's, whatever backend computes the batches."""
FIFO, FAIR = "fifo", "fair"
BUSY, SMALL = "busy (16 streams)", "small (2 streams)"
STREAMS = {BUSY: 16, SMALL: 2}
SMALL_KEEPS_AT_LEAST = 0.45
TOTAL_WITHIN = 0.05
START_MARGIN_S = 2.0
"""Time for both clients to connect and warm up before their common start."""


@dataclass(frozen=True)
class Settings:
    cell_s: float
    rounds: int
    rows: int
    in_flight: int
    model: str = MODEL
    """The model the load cells' servers serve."""
    generate_flags: tuple[str, ...] = ()
    """``udfserve models generate`` flags that write ``model`` beside ``SPARK_MODEL``."""

    @classmethod
    def make(cls, quick: bool) -> Settings:
        # Requests as the Spark client sends them: rows_per_request 4096 (the model's max_batch_size),
        # max_in_flight 4 per task.
        if quick:
            return cls(
                cell_s=0.8, rounds=1, rows=4096, in_flight=2, model=QUICK_MODEL, generate_flags=("--onnx",)
            )
        return cls(cell_s=6.0, rounds=3, rows=4096, in_flight=4)


def load(server: ServerProcess, app: str, settings: Settings, start_at_epoch_s: float) -> LoadSpec:
    return LoadSpec(
        target=server.grpc_target(prefer_unix=True),
        model=settings.model,
        kind="preencoded",
        rows=settings.rows,
        streams=STREAMS[app],
        in_flight=settings.in_flight,
        duration_s=settings.cell_s,
        warmup_requests=1,
        app_id="app-busy" if app == BUSY else "app-small",
        start_at_epoch_s=start_at_epoch_s,
        # 16 streams of 4 requests of 4096 rows reach the queue's bound (an application's share
        # under fair shares, the whole queue under FIFO): back-pressure, as the Spark client reads it
        resend_exhausted=True,
    )


def measure(
    server: ServerProcess, apps: tuple[str, ...], settings: Settings
) -> tuple[dict[str, float], dict[str, float]]:
    """Rows/s of each of ``apps``, loading ``server`` over one window, and the mean time its
    requests waited in the server's queue (ms; warm-up included)."""
    before = app_counts(server)
    start_at = time.time() + START_MARGIN_S
    specs = {app: load(server, app, settings, start_at) for app in apps}
    clients = {app: start_in_child(spec) for app, spec in specs.items()}
    results = {app: finish(client, specs[app]) for app, client in clients.items()}
    after = app_counts(server)
    waits = {
        app: after.get(specs[app].app_id, AppCounts())
        .minus(before.get(specs[app].app_id, AppCounts()))
        .mean_wait_ms
        for app in apps
    }
    for app, result in results.items():
        logger.info(
            "  %s: %.0f rows/s, %d resends after RESOURCE_EXHAUSTED",
            app,
            result.rows / result.wall_s,
            result.resends,
        )
    return {app: result.rows / result.wall_s for app, result in results.items()}, waits


@dataclass(frozen=True)
class AppCounts:
    """What the server counted for one application: its rows and its requests' queue waits."""

    rows: float = 0.0
    wait_sum_s: float = 0.0
    wait_count: float = 0.0

    def minus(self, before: AppCounts) -> AppCounts:
        return AppCounts(
            self.rows - before.rows, self.wait_sum_s - before.wait_sum_s, self.wait_count - before.wait_count
        )

    @property
    def mean_wait_ms(self) -> float:
        return 1e3 * self.wait_sum_s / self.wait_count if self.wait_count else float("nan")


def app_counts(server: ServerProcess) -> dict[str, AppCounts]:
    """The server's per-application series (``udfserve_app_rows_total``,
    ``udfserve_app_queue_wait_seconds``), by application id, from one scrape read once."""
    fields = {
        "udfserve_app_rows_total": "rows",
        "udfserve_app_queue_wait_seconds_sum": "wait_sum_s",
        "udfserve_app_queue_wait_seconds_count": "wait_count",
    }
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(scrape(server)):
        for sample in family.samples:
            field = fields.get(sample.name)
            if field is not None:
                counts = found.setdefault(sample.labels["app_id"], {})
                counts[field] = counts.get(field, 0.0) + sample.value
    return {app_id: AppCounts(**counts) for app_id, counts in found.items()}


def counted_since(server: ServerProcess, before: dict[str, AppCounts]) -> list[AppCounts]:
    """Each application's counts since ``before``, the ones with rows, most rows first."""
    after = app_counts(server)
    deltas = [counts.minus(before.get(app_id, AppCounts())) for app_id, counts in after.items()]
    return sorted((d for d in deltas if d.rows > 0), key=lambda d: -d.rows)


@dataclass(frozen=True)
class SparkSettings:
    busy_rows: int
    small_rows: int
    alone_cells: bool
    """False (quick): only the two applications together, under fair shares."""

    @classmethod
    def make(cls, quick: bool) -> SparkSettings:
        if quick:
            return cls(busy_rows=6_000, small_rows=500, alone_cells=False)
        return cls(busy_rows=400_000, small_rows=60_000, alone_cells=True)


SPARK_MODEL = "sequence_bilstm"
SPARK_IN_FLIGHT = {BUSY: 16, SMALL: 2}
SPARK_TASKS = {BUSY: 2, SMALL: 1}


def spark_job(server: ServerProcess, app: str, rows: int, log_dir: Path, gate: Path) -> Job:
    return Job(
        contender="predict_arrow",
        model=SPARK_MODEL,
        synthetic_rows=rows,
        partitions=SPARK_TASKS[app],
        address=server.grpc_target(prefer_unix=True),
        log_file=str(log_dir / f"fairness-spark-{app.split()[0]}.log"),
        client_settings={"max_in_flight": SPARK_IN_FLIGHT[app]},
        warmup_rows=SPARK_WARMUP_ROWS,
        start_gate=str(gate),
    )


def cpus_apart() -> tuple[set[int], set[int]]:
    """The CPUs of the Spark part's servers and of its applications: the last CPU for the servers,
    the others for Spark (all of them for both on one CPU). A GPU node's device is apart from its
    executors' CPUs; sharing the CPUs instead, the applications' own work, not the server's queue,
    bounds their rows, and the order of admission has nothing to reorder."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    return {cpus[-1]}, set(cpus[:-1])


@contextlib.contextmanager
def affinity(cpus: set[int]) -> Iterator[None]:
    """This thread on ``cpus`` meanwhile: the processes and threads it starts inherit them."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


SPARK_WARMUP_ROWS = 200
"""Rows each application scores untimed before the gate: its Python workers start, its channels open."""


def measure_spark(
    server: ServerProcess, apps: tuple[str, ...], settings: SparkSettings, log_dir: Path
) -> tuple[dict[str, float], dict[str, float]]:
    """Rows/s of each application's job, and the mean time its requests waited in the server's queue
    (ms, warm-up included); together, both timed jobs start at once (a start gate the applications
    wait at once warm). Raises when the small job did not end before the busy one."""
    before = app_counts(server)
    rows = {BUSY: settings.busy_rows, SMALL: settings.small_rows}
    results: dict[str, JobResult] = {}
    finished: dict[str, float] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    gate = log_dir / f"fairness-gate-{time.monotonic_ns()}"
    with ThreadPoolExecutor(max_workers=2) as pool:

        def run(app: str) -> None:
            results[app] = run_in_child(spark_job(server, app, rows[app], log_dir, gate))
            finished[app] = time.monotonic()

        futures = [pool.submit(run, app) for app in apps]
        deadline = time.monotonic() + 900
        while len(list(log_dir.glob(f"{gate.name}.*.ready"))) < len(apps):
            if time.monotonic() > deadline or any(future.done() for future in futures):
                for future in futures:
                    if future.done():
                        future.result()  # its error, if it failed
                raise RuntimeError("the Spark applications did not all reach the start gate")
            time.sleep(0.2)  # a look at the files the applications write when warm
        gate.touch()
        for future in futures:
            future.result()
    for marker in log_dir.glob(f"{gate.name}*"):
        marker.unlink()
    if len(apps) > 1 and finished[SMALL] > finished[BUSY]:
        raise RuntimeError(
            "the small application's job outlasted the busy one's: not measured beside it; expected "
            "more busy_rows"
        )
    # the Spark application ids are Spark's own: the busy job is the one of more rows
    counted = counted_since(server, before)
    by_rows = sorted(apps, key=lambda app: -rows[app])
    waits = {app: counts.mean_wait_ms for app, counts in zip(by_rows, counted, strict=False)}
    return {app: result.rows / result.runs_s[0] for app, result in results.items()}, waits


def run(
    workspace: Workspace, quick: bool = False, profile: bool = True, spark: bool = True
) -> ComparisonResult:
    del profile  # nothing to profile here
    settings = Settings.make(quick)
    started = time.perf_counter()
    repository = workspace.example_models(settings.generate_flags)
    servers = {
        mode: workspace.start_server(
            repository, f"fairness-{mode}", ["--models", settings.model, "--application-scheduling", mode]
        )
        for mode in (FIFO, FAIR)
    }
    cells: list[dict[str, object]] = []
    for round_index in range(settings.rounds):
        for mode in (FIFO, FAIR) if round_index % 2 == 0 else (FAIR, FIFO):
            for apps in ((BUSY,), (SMALL,), (BUSY, SMALL)):
                logger.info("fairness: %s, round %d, %s", mode, round_index, " + ".join(apps))
                rates, waits = measure(servers[mode], apps, settings)
                cells += [
                    {
                        "mode": mode,
                        "round": round_index,
                        "together": len(apps) > 1,
                        "app": app,
                        "rows_s": rate,
                        "queue_wait_ms": waits[app],
                    }
                    for app, rate in rates.items()
                ]
    spark_cells: list[dict[str, object]] = []
    if spark:
        spark_settings = SparkSettings.make(quick)
        for server in servers.values():
            workspace.stop_server(server)
        server_cpus, spark_cpus = cpus_apart()
        with affinity(server_cpus):  # the servers' threads inherit it
            servers = {
                mode: workspace.start_server(
                    repository,
                    f"fairness-spark-{mode}",
                    ["--models", SPARK_MODEL, "--application-scheduling", mode],
                )
                for mode in ((FIFO, FAIR) if spark_settings.alone_cells else (FAIR,))
            }
        shapes = ((BUSY,), (SMALL,), (BUSY, SMALL)) if spark_settings.alone_cells else ((BUSY, SMALL),)
        # shape by shape, both schedulings back to back: what else the machine runs lands on both
        for apps in shapes:
            for mode, server in servers.items():
                logger.info("fairness, Spark: %s, %s", mode, " + ".join(apps))
                with affinity(spark_cpus):  # the applications' drivers, JVMs and Python workers
                    rates, waits = measure_spark(server, apps, spark_settings, LOGS_DIR)
                spark_cells += [
                    {
                        "mode": mode,
                        "together": len(apps) > 1,
                        "app": app,
                        "rows_s": rate,
                        "queue_wait_ms": waits.get(app, float("nan")),
                    }
                    for app, rate in rates.items()
                ]
    for server in servers.values():
        workspace.stop_server(server)
    return _result(cells, spark_cells, settings, time.perf_counter() - started)


def _median(
    cells: list[dict[str, object]], mode: str, app: str, together: bool, field: str = "rows_s"
) -> float:
    values = sorted(
        float(c[field])  # type: ignore[arg-type]
        for c in cells
        if (c["mode"], c["app"], c["together"]) == (mode, app, together)
    )
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _spark_table(spark_cells: list[dict[str, object]]) -> Table:
    table = Table(
        f"Two Spark applications, predict_arrow on {SPARK_MODEL}: rows/s of each job alone and together",
        [
            "scheduling",
            "application",
            "alone rows/s",
            "together rows/s",
            "together ÷ alone",
            "queue wait ms, together",
        ],
    )
    for mode in (FIFO, FAIR):
        for app in STREAMS:
            alone = [
                c["rows_s"] for c in spark_cells if (c["mode"], c["app"], c["together"]) == (mode, app, False)
            ]
            together = [c for c in spark_cells if (c["mode"], c["app"], c["together"]) == (mode, app, True)]
            if not together:
                continue
            row: dict[str, object] = {
                "scheduling": mode,
                "application": app,
                "together rows/s": together[0]["rows_s"],
                "queue wait ms, together": together[0]["queue_wait_ms"],
            }
            if alone:
                together_rows_s = float(together[0]["rows_s"])  # type: ignore[arg-type]
                row |= {"alone rows/s": alone[0], "together ÷ alone": together_rows_s / float(alone[0])}  # type: ignore[arg-type]
            table.rows.append(row)
    return table


def _result(
    cells: list[dict[str, object]],
    spark_cells: list[dict[str, object]],
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    table = Table(
        f"{settings.model}, rows/s of each application alone and together "
        f"(median of {settings.rounds} rounds)",
        [
            "scheduling",
            "application",
            "alone rows/s",
            "together rows/s",
            "together ÷ alone",
            "share of total",
            "queue wait ms, together",
        ],
    )
    totals = {}
    for mode in (FIFO, FAIR):
        together = {app: _median(cells, mode, app, True) for app in STREAMS}
        totals[mode] = sum(together.values())
        for app in STREAMS:
            alone = _median(cells, mode, app, False)
            table.rows.append(
                {
                    "scheduling": mode,
                    "application": app,
                    "alone rows/s": alone,
                    "together rows/s": together[app],
                    "together ÷ alone": together[app] / alone,
                    "share of total": f"{together[app] / totals[mode]:.0%}",
                    "queue wait ms, together": _median(cells, mode, app, True, "queue_wait_ms"),
                }
            )
    small_kept = _median(cells, FAIR, SMALL, True) / _median(cells, FAIR, SMALL, False)
    small_kept_fifo = _median(cells, FIFO, SMALL, True) / _median(cells, FIFO, SMALL, False)
    total_ratio = totals[FAIR] / totals[FIFO]
    targets = [
        TargetCheck(
            f"fair shares: the small application keeps at least {SMALL_KEEPS_AT_LEAST:.2f}x its rate alone",
            f"{small_kept:.2f}x (first in first out: {small_kept_fifo:.2f}x)",
            small_kept >= SMALL_KEEPS_AT_LEAST,
        ),
        TargetCheck(
            f"fair shares: total rows/s within {TOTAL_WITHIN:.0%} of first in first out",
            f"{total_ratio:.3f}x ({totals[FAIR]:,.0f} vs {totals[FIFO]:,.0f} rows/s)",
            total_ratio >= 1 - TOTAL_WITHIN,
        ),
    ]
    method = (
        f"One `{settings.model}` (64→256→256→8, max_batch_size 4096, max_queue_delay_s 0.002) on two "
        "servers of this tree, `--application-scheduling fifo` and `fair`, both up, over the unix socket. "
        "Each application is a client process of its own (`benchmarks/load_client.py`) whose `grpc.aio` "
        "streams, each on its "
        "own connection, name the application in their metadata (`udfserve-spark-app-id`) and keep "
        f"{settings.in_flight} requests of {settings.rows} rows outstanding (a closed loop, as Spark tasks "
        f"are): {STREAMS[BUSY]} streams for the busy application, {STREAMS[SMALL]} for the small one. Each "
        f"cell runs {settings.cell_s:g} s; together, both clients start their timed run at one wall-clock "
        "time. Rounds alternate the order of the two servers; the table gives each cell's median. A "
        "request refused RESOURCE_EXHAUSTED (an application at its bound) is sent again after a back-off, "
        "as the Spark client does. The queue wait is the server's own "
        "(`udfserve_app_queue_wait_seconds`, its mean over the cell)."
    )
    return ComparisonResult(
        name=NAME,
        title="Fair shares: two applications on one server",
        method=method,
        tables=[table, _spark_table(spark_cells)] if spark_cells else [table],
        targets=targets,
        raw={"cells": cells, "spark_cells": spark_cells, "settings": settings.__dict__},
        duration_s=duration_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser)
    parser.add_argument("--no-spark", action="store_true", help="leave out the two Spark applications")
    args = parser.parse_args(argv)
    configure_logging()
    with Workspace() as workspace:
        result = run(workspace, args.quick, spark=not args.no_spark)
    return write_and_print(result, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
