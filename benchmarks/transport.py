"""Comparison 2, transport: Arrow batches through gRPC to an identity model, unix socket and TCP,
next to pyarrow IPC write and read of the same batches alone (the limit of the format here).

    python -m benchmarks.transport [--quick] [--no-profile]

One client process keeps ``IN_FLIGHT`` batches in flight on one Predict stream for a fixed time
per request size; every request is encoded in the loop and every answer decoded, as a real
client would. The identity model answers every batch with the same bytes, so each request moves
its payload through the socket twice, there and back: throughput is quoted both ways (the bytes
that crossed the socket per second) and for the requests alone (half of it). A bare gRPC echo
server of the same service is measured too: the ceiling of Python gRPC on this machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.load_client import LoadSpec, finish, make_batch, start_in_child
from benchmarks.models import IDENTITY_MODEL, generate_identity_in_child
from benchmarks.processes import GLIBC_MALLOC_DEFAULTS, MALLOC_KEEPS_MEMORY, ProcessMeter, Workspace
from benchmarks.profiling import ProfileSummary, SampledProfile, py_spy_available
from benchmarks.report import RESULTS_DIR, ComparisonResult, Table, TargetCheck
from benchmarks.stages import stage_sums_us, stages_in_child, stages_table
from udfserve.protocol.arrow_ipc import decode_batch, encode_batch

logger = logging.getLogger(__name__)

NAME = "transport"
WIDTH = 64
"""float32 values per row: the tabular model's 64 features."""
IN_FLIGHT = 4
MAX_MESSAGE_BYTES = 256 << 20
ROWS_FULL = (1024, 4096, 16384, 65536)
ROWS_QUICK = (1024, 16384)
TARGET_GB_S = 1.0
TARGET_RATIO_TO_IPC = 3.0
UNIX = "udfserve, unix socket"
TCP = "udfserve, TCP loopback"
ECHO = "bare gRPC echo, unix socket"
UNIX_GLIBC = "udfserve, unix socket, glibc malloc defaults"
CLIENT_INLINE = "udfserve, Spark client's stream, unix socket, payload inline"
CLIENT_SHARED_MEMORY = "udfserve, Spark client's stream, unix socket, payload in shared memory"
UDFSERVE_UNIX = (UNIX, CLIENT_INLINE, CLIENT_SHARED_MEMORY)
"""The rows the targets are judged on: udfserve's server over its unix socket, with the product's
allocator settings, whichever way the payload travels."""
ECHO_MALLOC = "bare gRPC echo, unix socket, malloc keeps memory"


@dataclass(frozen=True)
class Settings:
    quick: bool
    rows: tuple[int, ...]
    cell_s: float
    ipc_s: float
    stage_s: float
    profile: bool
    profile_s: float

    @classmethod
    def make(cls, quick: bool, profile: bool) -> Settings:
        if quick:
            return cls(quick, ROWS_QUICK, cell_s=0.8, ipc_s=0.3, stage_s=0.1, profile=profile, profile_s=2.0)
        return cls(quick, ROWS_FULL, cell_s=4.0, ipc_s=1.5, stage_s=0.5, profile=profile, profile_s=6.0)


@dataclass
class Cell:
    contender: str
    rows: int
    ipc_bytes: int
    requests: int
    wall_s: float
    request_mb_s: float
    rows_s: float
    p50_ms: float
    p99_ms: float
    client_cpu: float
    server_cpu: float
    client_faults_per_request: float
    server_faults_per_request: float
    server_cpu_us_by_thread: dict[str, float]

    @property
    def both_ways_gb_s(self) -> float:
        return 2 * self.request_mb_s / 1000

    @property
    def us_per_request(self) -> float:
        return self.wall_s / self.requests * 1e6 if self.requests else float("nan")

    @property
    def cpu_ms_per_mb(self) -> float:
        """Client and server CPU per MB through the socket (both ways): unlike the rate, this does
        not depend on what else the machine runs."""
        megabytes_both_ways = 2 * self.request_mb_s * self.wall_s
        return (self.client_cpu + self.server_cpu) * self.wall_s / megabytes_both_ways * 1e3

    @property
    def two_core_ceiling_gb_s(self) -> float:
        """The rate both ways if the client and the server had two idle cores to themselves."""
        return 2.0 / self.cpu_ms_per_mb


@dataclass(frozen=True)
class FormatLimit:
    """The same batch written and read in memory, no gRPC."""

    ipc_bytes: int
    pyarrow_mb_s: float
    codec_mb_s: float


def format_limit(batch: pa.RecordBatch, duration_s: float) -> FormatLimit:
    """pyarrow IPC write + read of ``batch`` (the format alone: into an Arrow buffer and back),
    and ``encode_batch`` + ``decode_batch`` as client and server use them (plus the copy into
    Python ``bytes`` that gRPC needs, and a full validation)."""

    def pyarrow_round() -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        pa.ipc.open_stream(sink.getvalue()).read_next_batch()

    def codec_round() -> None:
        decode_batch(encode_batch(batch))

    size = len(encode_batch(batch))
    return FormatLimit(size, _mb_s(pyarrow_round, size, duration_s), _mb_s(codec_round, size, duration_s))


def _mb_s(operation: Callable[[], None], size: int, duration_s: float) -> float:
    operation()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < duration_s:
        operation()
        count += 1
    return size * count / (time.perf_counter() - started) / 1e6


@dataclass(frozen=True)
class Contender:
    """A server to send to, how to reach it, and the environment of the client process."""

    target: str
    server_pid: int
    client_env: dict[str, str]
    kind: str = "encode"
    """The load client's kind (``benchmarks.load_client``)."""


def measure(
    name: str, contender: Contender, rows: int, duration_s: float, profile_dir: Path | None = None
) -> tuple[Cell, list[ProfileSummary]]:
    """One cell: the load client in its own process against ``contender`` for ``duration_s``.

    With ``profile_dir`` the server and the client are sampled by py-spy while it runs.
    """
    spec = LoadSpec(
        target=contender.target,
        model=IDENTITY_MODEL,
        kind=contender.kind,
        rows=rows,
        streams=1,
        in_flight=IN_FLIGHT,
        duration_s=duration_s,
        max_message_bytes=MAX_MESSAGE_BYTES,
    )
    server = ProcessMeter(contender.server_pid)
    client = start_in_child(spec, contender.client_env)
    server.start()
    profiles: list[ProfileSummary] = []
    if profile_dir is None:
        result = finish(client, spec)
    else:
        with (
            SampledProfile(contender.server_pid, profile_dir / "transport-server.txt") as server_profile,
            SampledProfile(client.pid, profile_dir / "transport-client.txt") as client_profile,
        ):
            result = finish(client, spec)
        profiles = [
            server_profile.summary(f"server, unix socket, {rows:,} rows per request"),
            client_profile.summary(f"client, unix socket, {rows:,} rows per request"),
        ]
    usage = server.stop()
    requests = max(result.requests, 1)
    cell = Cell(
        contender=name,
        rows=rows,
        ipc_bytes=result.request_bytes // requests,
        requests=result.requests,
        wall_s=result.wall_s,
        request_mb_s=result.request_bytes / result.wall_s / 1e6,
        rows_s=result.rows / result.wall_s,
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        client_cpu=result.cpu_s / result.wall_s,
        server_cpu=usage.utilisation,
        client_faults_per_request=result.minor_faults / requests,
        server_faults_per_request=usage.minor_faults / requests,
        server_cpu_us_by_thread={group: cpu / requests * 1e6 for group, cpu in usage.cpu_s_by_group.items()},
    )
    return cell, profiles


def run(workspace: Workspace, quick: bool = False, profile: bool = True) -> ComparisonResult:
    settings = Settings.make(quick, profile and py_spy_available())
    started = time.perf_counter()
    repository = workspace.path("identity-repo")
    generate_identity_in_child(
        repository, WIDTH, {"max_batch_size": max(ROWS_FULL), "dynamic_batching": {"enabled": False}}
    )
    limits_args = ["--max-message-bytes", str(MAX_MESSAGE_BYTES)]
    # The launcher starts servers with malloc keeping freed memory (the product's default);
    # the second server runs with glibc's own defaults, for the comparison.
    server = workspace.start_server(repository, "transport", limits_args)
    glibc = workspace.start_server(repository, "transport-glibc", limits_args, env=GLIBC_MALLOC_DEFAULTS)
    echo = workspace.start_echo_server(MAX_MESSAGE_BYTES)
    echo_tuned = workspace.start_echo_server(MAX_MESSAGE_BYTES, env=MALLOC_KEEPS_MEMORY)
    contenders = {
        UNIX: Contender(server.grpc_target(prefer_unix=True), server.pid, MALLOC_KEEPS_MEMORY),
        TCP: Contender(server.grpc_target(prefer_unix=False), server.pid, MALLOC_KEEPS_MEMORY),
        UNIX_GLIBC: Contender(glibc.grpc_target(prefer_unix=True), glibc.pid, {}),
        CLIENT_INLINE: Contender(
            server.grpc_target(prefer_unix=True), server.pid, MALLOC_KEEPS_MEMORY, "client_inline"
        ),
        CLIENT_SHARED_MEMORY: Contender(
            server.grpc_target(prefer_unix=True), server.pid, MALLOC_KEEPS_MEMORY, "client_shared_memory"
        ),
        ECHO: Contender(echo.grpc_target(prefer_unix=True), echo.pid, {}),
        ECHO_MALLOC: Contender(echo_tuned.grpc_target(prefer_unix=True), echo_tuned.pid, MALLOC_KEEPS_MEMORY),
    }
    cells: list[Cell] = []
    limits: dict[int, FormatLimit] = {}
    for rows in settings.rows:
        limits[rows] = format_limit(make_batch(rows), settings.ipc_s)
        for name, contender in contenders.items():
            logger.info("transport: %s, %d rows per request", name, rows)
            cells.append(measure(name, contender, rows, settings.cell_s)[0])
    for stopped in (echo, echo_tuned, glibc):
        workspace.stop_server(stopped)

    best = max((c for c in cells if c.contender == UNIX), key=lambda c: c.request_mb_s)
    profiles: list[ProfileSummary] = []
    if settings.profile:
        logger.info("transport: profiling %s at %d rows per request", UNIX, best.rows)
        profiles = measure(
            UNIX, contenders[UNIX], best.rows, settings.profile_s, RESULTS_DIR / "tmp" / "profiles"
        )[1]
    workspace.stop_server(server)
    stages = stages_in_child(repository, IDENTITY_MODEL, settings.rows, settings.stage_s)
    return _result(cells, limits, stages, profiles, settings, time.perf_counter() - started)


def _main_table(cells: list[Cell], limits: dict[int, FormatLimit]) -> Table:
    table = Table(
        f"Arrow batches of float32[{WIDTH}] rows through gRPC to an identity model, {IN_FLIGHT} in flight",
        [
            "server, transport",
            "rows/request",
            "MiB/request",
            "GB/s both ways",
            "request MB/s",
            "CPU ms per MB",
            "2 idle cores: GB/s",
            "p50 ms",
            "p99 ms",
            "pyarrow IPC MB/s",
            "IPC ÷ gRPC both ways",
            "client CPU",
            "server CPU",
            "client faults/request",
            "server faults/request",
        ],
    )
    for cell in cells:
        limit = limits[cell.rows]
        table.rows.append(
            {
                "server, transport": cell.contender,
                "rows/request": cell.rows,
                "MiB/request": limit.ipc_bytes / 2**20,
                "GB/s both ways": cell.both_ways_gb_s,
                "request MB/s": cell.request_mb_s,
                "CPU ms per MB": cell.cpu_ms_per_mb,
                "2 idle cores: GB/s": cell.two_core_ceiling_gb_s,
                "p50 ms": cell.p50_ms,
                "p99 ms": cell.p99_ms,
                "pyarrow IPC MB/s": limit.pyarrow_mb_s,
                "IPC ÷ gRPC both ways": limit.pyarrow_mb_s / (cell.both_ways_gb_s * 1000),
                "client CPU": f"{cell.client_cpu:.0%}",
                "server CPU": f"{cell.server_cpu:.0%}",
                "client faults/request": cell.client_faults_per_request,
                "server faults/request": cell.server_faults_per_request,
            }
        )
    return table


def _time_table(cells: list[Cell], stages: dict[str, Any]) -> Table:
    """A measured request against the sum of its stages timed alone, and the server's CPU by thread."""
    groups = (
        "event loop (main thread)",
        "other Python threads (inference calls)",
        "TensorFlow compute threads",
    )
    table = Table(
        "Per request over the unix socket: wall time, stages timed alone, the server's CPU by thread (µs)",
        [
            "server",
            "rows/request",
            "wall µs/request",
            "client stages",
            "server stages",
            *(f"server CPU: {group}" for group in groups),
            "server CPU: gRPC core and other threads",
        ],
    )
    for cell in cells:
        if cell.contender not in (UNIX, UNIX_GLIBC):
            continue
        sums = stage_sums_us(stages, cell.rows)
        by_thread = cell.server_cpu_us_by_thread
        table.rows.append(
            {
                "server": "glibc malloc defaults" if cell.contender == UNIX_GLIBC else "default",
                "rows/request": cell.rows,
                "wall µs/request": cell.us_per_request,
                "client stages": sums["client"],
                "server stages": sums["server"],
                **{f"server CPU: {group}": by_thread.get(group, 0.0) for group in groups},
                "server CPU: gRPC core and other threads": sum(
                    v for k, v in by_thread.items() if k not in groups
                ),
            }
        )
    return table


def _result(
    cells: list[Cell],
    limits: dict[int, FormatLimit],
    stages: dict[str, Any],
    profiles: list[ProfileSummary],
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    limit_table = Table(
        "The format alone: the same batches written and read in memory, no gRPC",
        ["rows/batch", "MiB/batch", "pyarrow IPC write+read MB/s", "encode_batch+decode_batch MB/s"],
        [
            {
                "rows/batch": rows,
                "MiB/batch": limit.ipc_bytes / 2**20,
                "pyarrow IPC write+read MB/s": limit.pyarrow_mb_s,
                "encode_batch+decode_batch MB/s": limit.codec_mb_s,
            }
            for rows, limit in limits.items()
        ],
    )

    def best_of(contender: str) -> Cell:
        return max((c for c in cells if c.contender == contender), key=lambda c: c.request_mb_s)

    best = max((best_of(name) for name in UDFSERVE_UNIX), key=lambda c: c.request_mb_s)
    inline_best, echo_best, glibc_best = best_of(UNIX), best_of(ECHO), best_of(UNIX_GLIBC)
    ratio = limits[best.rows].pyarrow_mb_s / (best.both_ways_gb_s * 1000)
    inline_ratio = limits[inline_best.rows].pyarrow_mb_s / (inline_best.both_ways_gb_s * 1000)
    targets = [
        TargetCheck(
            f"at least {TARGET_GB_S:.0f} GB/s through the unix socket at the best request size",
            f"{best.both_ways_gb_s:.2f} GB/s both ways ({best.request_mb_s / 1000:.2f} GB/s of requests) "
            f"at {best.rows:,} rows/request ({best.contender}): {best.both_ways_gb_s / TARGET_GB_S:.2f}x "
            f"the target. Payload inside the gRPC messages: {inline_best.both_ways_gb_s:.2f} GB/s "
            f"(Spark client's stream {best_of(CLIENT_INLINE).both_ways_gb_s:.2f}, "
            f"{glibc_best.both_ways_gb_s:.2f} with glibc's malloc defaults; a bare gRPC echo reaches "
            f"{echo_best.both_ways_gb_s:.2f})",
            best.both_ways_gb_s >= TARGET_GB_S,
        ),
        TargetCheck(
            f"within {TARGET_RATIO_TO_IPC:.0f}x of pyarrow IPC write+read of the same batch",
            f"pyarrow IPC {limits[best.rows].pyarrow_mb_s / 1000:.1f} GB/s is {ratio:.1f}x the best udfserve "
            f"figure both ways ({best.contender}); {inline_ratio:.1f}x the best with the payload inline",
            ratio <= TARGET_RATIO_TO_IPC,
        ),
    ]
    plot_file = f"{NAME}.png"
    xs = list(settings.rows)

    def series(contender: str, value: Callable[[Cell], float]) -> tuple[list[int], list[float]]:
        return xs, [value(c) for c in cells if c.contender == contender]

    plots.line_panels(
        results_dir(settings.quick) / plot_file,
        "Transport: Arrow IPC through gRPC to an identity model",
        [
            (
                "throughput, bytes through the socket both ways",
                "MB/s",
                {
                    **{
                        name: series(name, lambda c: c.both_ways_gb_s * 1000)
                        for name in (*UDFSERVE_UNIX, TCP, UNIX_GLIBC, ECHO, ECHO_MALLOC)
                    },
                    "pyarrow IPC write+read": (xs, [limits[x].pyarrow_mb_s for x in xs]),
                    "encode_batch+decode_batch": (xs, [limits[x].codec_mb_s for x in xs]),
                },
            ),
            (
                f"per-batch latency, p50, {IN_FLIGHT} in flight",
                "ms",
                {name: series(name, lambda c: c.p50_ms) for name in (*UDFSERVE_UNIX, TCP, UNIX_GLIBC, ECHO)},
            ),
        ],
        xlabel="rows per request",
        log_y=(True, True),
    )
    tables = [
        _main_table(cells, limits),
        limit_table,
        stages_table(stages, "Each stage of the request path timed alone, µs per request (identity model)"),
        _time_table(cells, stages),
    ]
    for summary in profiles:
        tables += summary.tables()
    method = (
        f"An identity Keras model (float32[{WIDTH}] in, the same out) in the benchmark's own repository, "
        "batching off so each request is one backend call. A client process of its own "
        "(`benchmarks/load_client.py`) drives one Predict stream "
        f"with {IN_FLIGHT} batches in flight for {settings.cell_s:.0f} s per cell, encoding every request "
        "(`encode_batch`) and decoding every answer (`decode_batch`) in the loop. Requests are "
        "`list<float>` columns, as Spark sends `array<float>`; answers are `fixed_size_list<float>`. "
        "Each request's bytes cross the socket twice (there, and back as the answer): *GB/s both ways* "
        "counts both (10^9 bytes/GB), *request MB/s* the requests alone. The bare gRPC echo server "
        "(`benchmarks/echo_server.py`) implements the same service and returns each request's bytes "
        "untouched: no Arrow, no model. *malloc keeps memory*: the process runs with glibc's "
        "`MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824`, so freed buffers are reused "
        "instead of being returned to the system and faulted in again. udfserve's launcher starts its "
        "servers that way unless told otherwise, and the deployment files give the executors the same "
        "settings, so udfserve's default rows run server and client with them and the targets are judged "
        "on them; *glibc malloc defaults* is a server and a client without them. The echo server's plain "
        "rows run with glibc's defaults, its *malloc keeps memory* rows with the settings. Client and "
        "server CPU are CPU-seconds per wall second (100% = one core). *CPU ms per MB* adds the "
        "client's and the server's CPU time per MB through "
        "the socket (both ways); unlike the rate it hardly depends on what else the machine runs, and "
        "*2 idle cores: GB/s* is the rate it allows if client and server had both cores to themselves. "
        "The two *Spark client's stream* rows run the product's client instead "
        "(`udfserve.spark_client.wire.transport.PredictStream` over `ArrowWire`, as a partition of "
        f"`predict_arrow` uses it: batches in order, {IN_FLIGHT} held, every answer decoded): "
        "*payload inline* puts each batch in the gRPC message; *payload in shared memory* writes it "
        "into a reused file of `/dev/shm` that the server reads by copy (`preadv`) and writes the "
        "answer into (`pwrite`), so only a few dozen bytes cross the socket per request. For those "
        "rows *GB/s both ways* counts the payload moved between the two processes (each batch there "
        "and its answer back) the same way. "
        "faults/request are minor page faults per request (a fault per 4 KiB page of "
        "memory touched for the first time). The stage table times each step of the path alone, in one "
        "process, with the server's own functions (`benchmarks/stages.py`)."
    )
    notes = []
    if profiles:
        notes.append(
            f"py-spy profiles of the server and the client at the best unix-socket size ({best.rows:,} rows) "
            "are in the last tables; a thread is sampled while it runs, not while it waits."
        )
    return ComparisonResult(
        name=NAME,
        title="Transport: Arrow through gRPC vs Arrow IPC alone",
        method=method,
        tables=tables,
        targets=targets,
        notes=notes,
        plot_file=plot_file,
        raw={
            "cells": [asdict(c) for c in cells],
            "format_limit": {str(rows): asdict(limit) for rows, limit in limits.items()},
            "stages": stages,
            "profiles": [p.to_dict() for p in profiles],
        },
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
