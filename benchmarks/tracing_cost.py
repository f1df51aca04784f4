"""What tracing costs a server: tracing off, 1% and 100% of requests sampled, and the code before
tracing existed, side by side.

    python -m benchmarks.tracing_cost [--quick]

Four servers of the tabular MLP, alike but for tracing: off (no ``UDFSERVE_TRACING_*``), and on,
exporting to a JSON-lines file, with ``UDFSERVE_TRACING_SAMPLE_RATIO`` 0.01 and 1 (the load's
requests carry no traceparent, so the server's ratio decides for each); and a server of the tree
of the commit before tracing landed (``BEFORE_TRACING``, extracted with ``git archive`` from this
checkout's history and run from a tree of links on ``PYTHONPATH``, as ``benchmarks.text_runs``
runs a baseline tree), the reference tracing off is held to. All four are up; each round
measures every server once at each point, in an order that rotates from round to round, so a
change in what else the machine runs lands on all four. Clients: ``grpc.aio`` streams in a
child process, one request outstanding each, requests encoded beforehand (the batching
comparison's closed loop). Per cell: the median over the rounds; the spread of the rounds of the
server without tracing is the noise the others are read against.

Then one Spark task (local mode, one partition of 3,000 rows in requests of 1,000) is run against
the 100% server with a job traceparent, and its trace is printed as a tree
(``observability.span_tree``): what an operator sees of one task.
"""

from __future__ import annotations

import io
import logging
import os
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.batching import measure_cell
from benchmarks.cli import main_for
from benchmarks.client_trees import linked_tree
from benchmarks.processes import Workspace
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.text_runs import REPO_ROOT
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.services.model_server.observability.span_tree import load_spans, render

logger = logging.getLogger(__name__)

NAME = "tracing_cost"
MODEL = "tabular_mlp"
OFF, ONE_PERCENT, ALL = "tracing off", "1% sampled", "100% sampled"
BEFORE_TRACING = "20bdd121935cf049ac6284bf1a8705fe4d5e88a8"
"""The parent of the commit tracing landed in (c840e0d): the server as it was without tracing."""
BEFORE = f"before tracing ({BEFORE_TRACING[:7]})"
CPU_NOISE_FLOOR = 0.10
"""The least CPU-per-request noise allowed for, whatever the rounds' spread (a quiet machine)."""
RATIOS = {ONE_PERCENT: 0.01, ALL: 1.0}
TASK_ROWS, TASK_ROWS_PER_REQUEST = 3_000, 1_000


@dataclass(frozen=True)
class Settings:
    points: tuple[tuple[int, int], ...]
    """(clients, rows per request)."""
    rounds: int
    cell_s: float

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(((1, 1), (16, 8)), rounds=2, cell_s=0.8)
        return cls(((1, 1), (16, 8), (4, 1024)), rounds=5, cell_s=3.0)


def run(workspace: Workspace, quick: bool = False, profile: bool = True) -> ComparisonResult:
    settings = Settings.make(quick)
    started = time.perf_counter()
    repository = workspace.repository("tracing", {MODEL: {}})
    spans_files = {
        mode: workspace.path(f"spans-{index}").with_suffix(".jsonl") for index, mode in enumerate(RATIOS)
    }
    servers: dict[str, ServerProcess] = {
        OFF: workspace.start_server(repository, "tracing-off", ["--models", MODEL]),
        BEFORE: workspace.start_server(
            repository, "before-tracing", ["--models", MODEL], env=_tree_env(workspace, BEFORE_TRACING)
        ),
    }
    for index, (mode, ratio) in enumerate(RATIOS.items()):
        env = {
            "UDFSERVE_TRACING_SPANS_FILE": str(spans_files[mode]),
            "UDFSERVE_TRACING_SAMPLE_RATIO": str(ratio),
        }
        servers[mode] = workspace.start_server(repository, f"tracing-{index}", ["--models", MODEL], env=env)
    modes = list(servers)
    cells: list[dict[str, Any]] = []
    for round_index in range(settings.rounds):
        for clients, rows in settings.points:
            shift = round_index % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                logger.info("tracing: round %d, %s, %d clients x %d rows", round_index, mode, clients, rows)
                cell = measure_cell(servers[mode], clients, rows, settings.cell_s, with_metrics=False)
                cells.append({"mode": mode, "clients": clients, "rows": rows, "round": round_index, **cell})
    traceparent = _spark_task(servers[ALL].grpc_target(prefer_unix=True))
    for server in servers.values():
        workspace.stop_server(server)  # flushes the spans
    spans = {mode: load_spans(path) if path.exists() else [] for mode, path in spans_files.items()}
    return _result(cells, spans, traceparent, settings, time.perf_counter() - started)


def _tree_env(workspace: Workspace, commit: str) -> dict[str, str]:
    """The variables that make ``python -m udfserve`` run ``commit``'s code: its files extracted
    from this checkout's history, linked under their package names first on ``PYTHONPATH``, and
    ``PYTHONSAFEPATH`` so the working folder (this checkout, when run from it) does not come first."""
    tree = workspace.path(f"tree-{commit[:12]}")
    tree.mkdir(parents=True)
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit], check=False, capture_output=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cannot read commit {commit[:12]} from {REPO_ROOT} "
            f"({done.stderr.decode(errors='replace').strip()}); "
            "expected a git checkout of udfserve with its history (not a shallow clone)"
        )
    archive = done.stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as files:
        files.extractall(tree, filter="data")
    env = {"PYTHONPATH": str(linked_tree(tree, workspace.path("linked"))), "PYTHONSAFEPATH": "1"}
    found = subprocess.run(
        [sys.executable, "-c", "import udfserve; print(udfserve.__file__)"],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not found.startswith(env["PYTHONPATH"]):
        raise RuntimeError(
            f"the server of {commit[:12]} would import udfserve from {found}; "
            f"expected it from {env['PYTHONPATH']}"
        )
    return env


def _spark_task(target: str) -> str:
    """One Spark task of ``TASK_ROWS`` rows under a sampled job traceparent; the traceparent."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from udfserve.spark_client import ClientConfig, remote_predict
    from udfserve.spark_client.tracing import job_traceparent

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("udfserve-bench-tracing")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    traceparent = job_traceparent(sampled=True)
    predict = remote_predict(
        MODEL,
        config=ClientConfig(
            address=target, fallback="error", rows_per_request=TASK_ROWS_PER_REQUEST, traceparent=traceparent
        ),
    )
    features = F.array(*[F.randn(seed=i).cast("float") for i in range(64)])
    spark.range(TASK_ROWS, numPartitions=1).select(predict(features)).write.format("noop").mode(
        "overwrite"
    ).save()
    spark.stop()
    return traceparent


def _median(cells: list[dict[str, Any]], mode: str, clients: int, rows: int, key: str) -> float:
    return statistics.median(
        cell[key] for cell in cells if (cell["mode"], cell["clients"], cell["rows"]) == (mode, clients, rows)
    )


def _spread(cells: list[dict[str, Any]], mode: str, clients: int, rows: int, key: str = "rows_s") -> float:
    """(max - min) / median of a mode's ``key`` over the rounds: the noise of one cell."""
    values = [
        cell[key] for cell in cells if (cell["mode"], cell["clients"], cell["rows"]) == (mode, clients, rows)
    ]
    return (max(values) - min(values)) / statistics.median(values)


def _result(
    cells: list[dict[str, Any]],
    spans: dict[str, list[dict[str, Any]]],
    traceparent: str,
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    table = Table(
        "The code before tracing, tracing off, 1% and 100% sampled: medians over the rounds, ratios "
        "against tracing off",
        [
            "clients x rows",
            "mode",
            "rows/s",
            "x off",
            "p50 ms",
            "p99 ms",
            "server CPU us/request",
            "x off (CPU)",
            "off's spread",
        ],
    )
    worst_one_percent = worst_off_rate = 1.0
    off_cpu_excess: list[tuple[float, float]] = []
    """(off's CPU per request / before's, the bound: 1 + off's CPU spread) at each point."""
    for clients, rows in settings.points:
        off_rate = _median(cells, OFF, clients, rows, "rows_s")
        off_cpu = _median(cells, OFF, clients, rows, "server_cpu_us_per_request")
        spread = _spread(cells, OFF, clients, rows)
        cpu_spread = _spread(cells, OFF, clients, rows, "server_cpu_us_per_request")
        for mode in (BEFORE, OFF, ONE_PERCENT, ALL):
            rate = _median(cells, mode, clients, rows, "rows_s")
            cpu = _median(cells, mode, clients, rows, "server_cpu_us_per_request")
            if mode == ONE_PERCENT:
                worst_one_percent = min(worst_one_percent, rate / off_rate)
            if mode == BEFORE:
                worst_off_rate = min(worst_off_rate, off_rate / rate)
                off_cpu_excess.append((off_cpu / cpu, 1 + max(CPU_NOISE_FLOOR, cpu_spread)))
            table.rows.append(
                {
                    "clients x rows": f"{clients} x {rows}",
                    "mode": mode,
                    "rows/s": rate,
                    "x off": rate / off_rate,
                    "p50 ms": _median(cells, mode, clients, rows, "p50_ms"),
                    "p99 ms": _median(cells, mode, clients, rows, "p99_ms"),
                    "server CPU us/request": cpu,
                    "x off (CPU)": cpu / off_cpu,
                    "off's spread": f"{spread:.0%} (CPU {cpu_spread:.0%})" if mode == OFF else "",
                }
            )
    requests_spans = {
        mode: sum(s["name"] == "udfserve.request" for s in found) for mode, found in spans.items()
    }
    trace = traceparent.split("-")[1]
    tree = render(spans[ALL], trace)
    method = __doc__ or ""
    return ComparisonResult(
        name=NAME,
        title="Tracing: the cost of OpenTelemetry spans on the request path",
        method=method.split("\n\n", 1)[1],
        tables=[table],
        targets=[
            TargetCheck(
                "1% sampling within noise of tracing off (rows/s ratio at least 0.9 at every point)",
                f"lowest ratio {worst_one_percent:.2f}",
                worst_one_percent >= 0.9,
            ),
            TargetCheck(
                f"tracing off within noise of the code before tracing ({BEFORE_TRACING[:7]}): rows/s ratio "
                "at least 0.9 at every point, CPU per request at most 1 + off's CPU spread over the "
                f"rounds (at least {CPU_NOISE_FLOOR:.0%}) at every point",
                f"lowest rows/s ratio {worst_off_rate:.2f}; CPU per request x "
                + ", ".join(f"{ratio:.2f} (bound {bound:.2f})" for ratio, bound in off_cpu_excess),
                worst_off_rate >= 0.9 and all(ratio <= bound for ratio, bound in off_cpu_excess),
            ),
        ],
        notes=[
            f"request spans recorded: {requests_spans[ONE_PERCENT]} at 1%, {requests_spans[ALL]} at 100% "
            "(including the warm-up requests and, at 100%, the Spark task's)",
            "the trace of one Spark task (3,000 rows in requests of 1,000), from the 100% server:\n\n```\n"
            + tree
            + "```",
        ],
        raw={"cells": cells, "trace": tree, "spans_recorded": requests_spans},
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
