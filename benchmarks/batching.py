"""Comparison 3, dynamic batching: many concurrent clients sending small requests to the tabular
MLP, with the server's dynamic batching on and off.

    python -m benchmarks.batching [--quick] [--no-profile]

Two repositories differ only in ``dynamic_batching.enabled`` of ``tabular_mlp``; each is served
by its own server; both are up, and the two cells of each point are measured back to back, in
alternating order. The clients are ``grpc.aio`` streams in one client process,
each on its own connection with one request outstanding (a closed loop, as perf_analyzer's
concurrency). Requests are encoded before the run, so the client's work per request is the gRPC
call itself. To show that the client is not what limits the rates, the same clients are run
against a bare gRPC echo server: the rates they reach there are the client's ceiling.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.load_client import LoadSpec, finish, start_in_child
from benchmarks.processes import ProcessMeter, Workspace, metric_value, scrape
from benchmarks.profiling import SampledProfile, py_spy_available
from benchmarks.report import RESULTS_DIR, ComparisonResult, Table, TargetCheck
from benchmarks.stages import stages_in_child, stages_table
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)

NAME = "batching"
MODEL = "tabular_mlp"
FEATURES = 64
TARGET_RATIO = 3.0
TARGET_CELL = (16, 8)  # clients, rows per request
ON, OFF, ECHO = "batching on", "batching off", "client ceiling (echo server)"


@dataclass(frozen=True)
class Settings:
    quick: bool
    clients: tuple[int, ...]
    rows: tuple[int, ...]
    cell_s: float
    profile: bool
    profile_s: float
    stage_s: float

    @classmethod
    def make(cls, quick: bool, profile: bool) -> Settings:
        if quick:
            return cls(quick, (1, 16), (1, 8), cell_s=0.8, profile=profile, profile_s=2.0, stage_s=0.1)
        return cls(quick, (1, 4, 16, 64), (1, 8, 64), cell_s=3.0, profile=profile, profile_s=5.0, stage_s=0.5)


def _batch_stats(before: str, after: str) -> tuple[float, float]:
    """(backend calls, mean rows per call) between two scrapes of the server's metrics."""
    calls = metric_value(after, "udfserve_batch_size_rows_count", model=MODEL) - metric_value(
        before, "udfserve_batch_size_rows_count", model=MODEL
    )
    rows = metric_value(after, "udfserve_batch_size_rows_sum", model=MODEL) - metric_value(
        before, "udfserve_batch_size_rows_sum", model=MODEL
    )
    return calls, rows / calls if calls else float("nan")


def measure_cell(
    server: ServerProcess, clients: int, rows: int, duration_s: float, with_metrics: bool
) -> dict[str, object]:
    """``clients`` closed-loop clients (one process, one connection each) for ``duration_s``."""
    spec = LoadSpec(
        target=server.grpc_target(prefer_unix=True),
        model=MODEL,
        kind="preencoded",
        rows=rows,
        streams=clients,
        in_flight=1,
        duration_s=duration_s,
        warmup_requests=1,
    )
    before = scrape(server) if with_metrics else ""
    meter = ProcessMeter(server.pid)
    client = start_in_child(spec)
    meter.start()
    result = finish(client, spec)
    usage = meter.stop()
    requests = max(result.requests, 1)
    cell: dict[str, object] = {
        "rows_s": result.rows / result.wall_s,
        "requests_s": result.requests / result.wall_s,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "client_cpu": result.cpu_s / result.wall_s,
        "server_cpu": usage.utilisation,
        "server_cpu_us_per_request": usage.cpu_s / requests * 1e6,
        "client_cpu_us_per_request": result.cpu_s / requests * 1e6,
        "server_cpu_us_per_request_by_thread": {
            group: seconds / requests * 1e6 for group, seconds in usage.cpu_s_by_group.items()
        },
    }
    if with_metrics:
        calls, mean_rows = _batch_stats(before, scrape(server))
        cell["backend_calls"] = calls
        cell["rows_per_call"] = mean_rows
    return cell


def run(workspace: Workspace, quick: bool = False, profile: bool = True) -> ComparisonResult:
    settings = Settings.make(quick, profile and py_spy_available())
    started = time.perf_counter()
    cells: list[dict[str, object]] = []
    profiles = []
    servers = {}
    for mode, enabled in ((ON, True), (OFF, False)):
        repository = workspace.repository(
            f"batching-{'on' if enabled else 'off'}", {MODEL: {"dynamic_batching": {"enabled": enabled}}}
        )
        servers[mode] = workspace.start_server(
            repository, f"batching-{'on' if enabled else 'off'}", ["--models", MODEL]
        )
    # Both servers up, the one not measured idle; the two cells of a point measured back to back,
    # in alternating order, so that a change in what else the machine runs lands on both.
    for index, (clients, rows) in enumerate(itertools.product(settings.clients, settings.rows)):
        for mode in (ON, OFF) if index % 2 == 0 else (OFF, ON):
            logger.info("batching: %s, %d clients x %d rows", mode, clients, rows)
            cell = measure_cell(servers[mode], clients, rows, settings.cell_s, with_metrics=True)
            cells.append({"mode": mode, "clients": clients, "rows": rows, **cell})
    for mode, server in servers.items():
        if settings.profile:
            profiles.append(_profile(server, mode, settings.profile_s))
        workspace.stop_server(server)
    echo = workspace.start_echo_server(64 << 20)
    for clients, rows in itertools.product(settings.clients, settings.rows):
        logger.info("batching: client ceiling, %d clients x %d rows", clients, rows)
        cell = measure_cell(echo, clients, rows, settings.cell_s, with_metrics=False)
        cells.append({"mode": ECHO, "clients": clients, "rows": rows, **cell})
    workspace.stop_server(echo)
    stages = stages_in_child(
        workspace.example_models(), MODEL, sorted({1, *settings.rows, 1024}), settings.stage_s
    )
    return _result(cells, stages, profiles, settings, time.perf_counter() - started)


def _profile(server: ServerProcess, mode: str, duration_s: float) -> object:
    clients, rows = TARGET_CELL
    output = RESULTS_DIR / "tmp" / "profiles" / f"batching-{mode.split()[-1]}-server.txt"
    with SampledProfile(server.pid, output) as profile:
        measure_cell(server, clients, rows, duration_s, with_metrics=False)
    return profile.summary(f"server, {mode}, {clients} clients x {rows} rows")


def _lookup(cells: list[dict[str, object]], mode: str, clients: int, rows: int) -> dict[str, object]:
    for cell in cells:
        if (cell["mode"], cell["clients"], cell["rows"]) == (mode, clients, rows):
            return cell
    raise KeyError(f"no cell {mode}, {clients} clients, {rows} rows")


THREAD_GROUPS = (
    "event loop (main thread)",
    "other Python threads (inference calls)",
    "TensorFlow compute threads",
    "gRPC core threads",
    "other threads",
)


def _threads_table(cells: list[dict[str, object]], settings: Settings) -> Table:
    """Where the server's CPU goes per request, by thread, from the kernel's per-thread counters."""
    table = Table(
        "Server CPU per request by thread, µs (from the kernel's per-thread CPU times)",
        ["batching", "clients", "rows/request", *THREAD_GROUPS, "total"],
    )
    for mode in (ON, OFF):
        for clients, rows in itertools.product(settings.clients, settings.rows):
            if clients < 4 and len(settings.clients) > 2:
                continue
            cell = _lookup(cells, mode, clients, rows)
            by_thread = cell["server_cpu_us_per_request_by_thread"]
            assert isinstance(by_thread, dict)
            table.rows.append(
                {
                    "batching": mode.split()[-1],
                    "clients": clients,
                    "rows/request": rows,
                    **{group: by_thread.get(group, 0.0) for group in THREAD_GROUPS},
                    "total": cell["server_cpu_us_per_request"],
                }
            )
    return table


def _result(
    cells: list[dict[str, object]],
    stages: dict[str, Any],
    profiles: list[object],
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    table = Table(
        "tabular_mlp, rows/s and latency by concurrent clients and rows per request",
        [
            "clients",
            "rows/request",
            "on: rows/s",
            "off: rows/s",
            "on ÷ off",
            "server CPU/row: off ÷ on",
            "on: p50 ms",
            "on: p99 ms",
            "off: p50 ms",
            "off: p99 ms",
            "on: rows/call",
            "client ceiling rows/s",
            "on: server CPU µs/request",
            "off: server CPU µs/request",
            "on: client CPU µs/request",
            "on: server CPU",
        ],
    )
    for clients, rows in itertools.product(settings.clients, settings.rows):
        on, off = _lookup(cells, ON, clients, rows), _lookup(cells, OFF, clients, rows)
        echo = _lookup(cells, ECHO, clients, rows)
        table.rows.append(
            {
                "clients": clients,
                "rows/request": rows,
                "on: rows/s": on["rows_s"],
                "off: rows/s": off["rows_s"],
                "on ÷ off": float(on["rows_s"]) / float(off["rows_s"]),  # type: ignore[arg-type]
                "server CPU/row: off ÷ on": float(off["server_cpu_us_per_request"])  # type: ignore[arg-type]
                / float(on["server_cpu_us_per_request"]),  # type: ignore[arg-type]
                "on: p50 ms": on["p50_ms"],
                "on: p99 ms": on["p99_ms"],
                "off: p50 ms": off["p50_ms"],
                "off: p99 ms": off["p99_ms"],
                "on: rows/call": on.get("rows_per_call"),
                "client ceiling rows/s": echo["rows_s"],
                "on: server CPU µs/request": on["server_cpu_us_per_request"],
                "off: server CPU µs/request": off["server_cpu_us_per_request"],
                "on: client CPU µs/request": on["client_cpu_us_per_request"],
                "on: server CPU": f"{float(on['server_cpu']):.0%}",  # type: ignore[arg-type]
            }
        )
    target_clients, target_rows = TARGET_CELL
    targets = []
    if target_clients in settings.clients and target_rows in settings.rows:
        on = _lookup(cells, ON, target_clients, target_rows)
        off = _lookup(cells, OFF, target_clients, target_rows)
        ratio = float(on["rows_s"]) / float(off["rows_s"])  # type: ignore[arg-type]
        targets.append(
            TargetCheck(
                f"batching on gives at least {TARGET_RATIO:.0f}x the rows/s of batching off "
                f"at {target_clients} clients x {target_rows} rows",
                f"{ratio:.2f}x ({float(on['rows_s']):,.0f} vs {float(off['rows_s']):,.0f} rows/s)",  # type: ignore[arg-type]
                ratio >= TARGET_RATIO,
            )
        )
    plot_file = f"{NAME}.png"
    panels = []
    for rows in settings.rows:
        series = {}
        for mode in (ON, OFF, ECHO):
            xs = list(settings.clients)
            series[mode] = (xs, [float(_lookup(cells, mode, c, rows)["rows_s"]) for c in xs])  # type: ignore[arg-type]
        panels.append((f"{rows} rows per request", "rows/s", series))
    plots.line_panels(
        results_dir(settings.quick) / plot_file,
        "Dynamic batching: tabular_mlp, concurrent clients",
        panels,
        xlabel="concurrent clients",
        log_y=tuple(True for _ in panels),
    )
    tables = [
        table,
        _threads_table(cells, settings),
        stages_table(stages, f"Each stage of a {MODEL} request timed alone, µs per request"),
    ]
    for summary in profiles:
        tables += summary.tables()  # type: ignore[attr-defined]
    method = (
        "`tabular_mlp` (64→256→256→8) served twice, from two repositories that differ only in "
        "`dynamic_batching.enabled` (max_batch_size 1024, max_queue_delay_s 0.002), both up (the one not "
        "measured idle), the two cells of each point measured back to back in alternating order. "
        "N clients in one client process (`benchmarks/load_client.py`), each a `grpc.aio` channel of its own "
        "with one request outstanding "
        f"(closed loop), for {settings.cell_s:.0f} s per cell, over the unix socket; requests are encoded "
        "beforehand. `rows/call` is the mean rows per backend call from the server's metrics. The client "
        "ceiling is the same client against a bare gRPC echo server (no model): where it is well above "
        "the served rates, the client is not what limits them. *server CPU µs/request* is the server "
        "process's CPU time (all threads) divided by the requests answered, and *server CPU/row: off ÷ on* "
        "how much CPU batching saves per row: unlike the rates, it hardly depends on what else the machine "
        "runs. *server CPU* is CPU-seconds per "
        "wall second (100% = one core). The stage table times each step of one request alone, in one "
        "process, with the server's own functions: it shows what a backend call costs at each size, "
        "and what the conversions around it cost."
    )
    return ComparisonResult(
        name=NAME,
        title="Dynamic batching: many small requests",
        method=method,
        tables=tables,
        targets=targets,
        plot_file=plot_file,
        raw={"cells": cells, "profiles": [p.to_dict() for p in profiles]},  # type: ignore[attr-defined]
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
