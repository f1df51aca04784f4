"""A load-generating client in a process of its own, driven by the transport and batching comparisons.

Running the client apart from the benchmark driver gives it its own CPU account and its own
allocator settings (the environment it is started with), and keeps the driver's state out of it.

    python -m benchmarks.load_client '{"target": "unix:///s.sock", "model": "identity", ...}'

Kinds of load: ``encode`` makes one batch of ``rows`` rows and encodes it for every request
(a client's real work), decoding every answer; ``preencoded`` sends ``PAYLOADS`` requests encoded
beforehand in turn and only checks the answers, so that the client costs as little as it can.
``client_inline`` and ``client_shared_memory`` run the Spark client's own stream
(``udfserve.spark_client.wire.transport.PredictStream``, one partition's batches in order, ``in_flight`` held)
with its payloads in the gRPC messages or in the node's shared memory. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import resource
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

PAYLOADS = 16
FEATURES = 64


@dataclass(frozen=True)
class LoadSpec:
    target: str
    model: str
    kind: str
    rows: int
    streams: int
    in_flight: int
    duration_s: float
    max_message_bytes: int = 256 << 20
    warmup_requests: int = 2
    app_id: str = ""
    """The Spark application the streams claim to belong to (none when empty)."""
    priority_class: str = ""
    start_at_epoch_s: float = 0.0
    """Wall-clock time the timed run starts (after the warm-up): several clients over one window."""
    resend_exhausted: bool = False
    """Send a request refused with RESOURCE_EXHAUSTED again after a back-off, as the Spark client
    does, instead of failing (``preencoded`` and ``encode`` kinds)."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        from udfserve.spark_job_keys import METADATA_PREFIX

        pairs = [("app-id", self.app_id), ("app-name", self.app_id), ("priority-class", self.priority_class)]
        return tuple((METADATA_PREFIX + key, value) for key, value in pairs if value)


@dataclass
class LoadResult:
    wall_s: float
    requests: int
    rows: int
    request_bytes: int
    p50_ms: float
    p99_ms: float
    cpu_s: float
    minor_faults: int
    resends: int = 0
    """Requests sent again after RESOURCE_EXHAUSTED (``LoadSpec.resend_exhausted``)."""


def make_batch(rows: int, seed: int = 0) -> pa.RecordBatch:
    """``rows`` rows of ``list<float>`` [64], the Arrow type of a Spark ``array<float>`` column."""
    values = np.random.default_rng(seed).standard_normal(rows * FEATURES, dtype=np.float32)
    offsets = np.arange(0, rows * FEATURES + 1, FEATURES, dtype=np.int32)
    return pa.record_batch({"features": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})


CLIENT_KINDS = ("client_inline", "client_shared_memory")


def run_client_load(spec: LoadSpec) -> LoadResult:
    """The Spark client's stream for ``duration_s``: latency is from the moment the stream takes a
    batch (and sends it) to the moment it yields that batch's answer, in order."""
    from benchmarks.processes import percentile
    from udfserve.shared_memory import ipc_stream_size
    from udfserve.spark_client.common.config import ClientConfig
    from udfserve.spark_client.wire.arrow_wire import arrow_stream
    from udfserve.spark_client.wire.channels import connect
    from udfserve.spark_client.wire.transport import HeldBatch

    config = ClientConfig(
        shared_memory=spec.kind == "client_shared_memory",
        max_in_flight=spec.in_flight,
        rows_per_request=spec.rows,
        max_message_bytes=spec.max_message_bytes,
    ).task_config()
    channel, _ = connect(spec.target, config, spec.model)
    batch = make_batch(spec.rows)
    taken: deque[float] = deque()

    def batches(stop_at: float, count: int | None = None) -> Iterator[HeldBatch]:
        for index in itertools.count():
            if time.perf_counter() >= stop_at or (count is not None and index >= count):
                return
            taken.append(time.perf_counter())
            yield HeldBatch(batch)

    for _ in arrow_stream(channel, spec.target, spec.model, config).run(
        batches(float("inf"), spec.warmup_requests)
    ):
        taken.popleft()
    latencies: list[float] = []
    rows = 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    stream = arrow_stream(channel, spec.target, spec.model, config)
    for answered in stream.run(batches(started + spec.duration_s)):
        latencies.append(time.perf_counter() - taken.popleft())
        rows += answered.batch.num_rows
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return LoadResult(
        wall_s=wall_s,
        requests=len(latencies),
        rows=rows,
        request_bytes=len(latencies) * ipc_stream_size(batch),
        p50_ms=percentile(latencies, 50) * 1e3,
        p99_ms=percentile(latencies, 99) * 1e3,
        cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        minor_faults=after.ru_minflt - before.ru_minflt,
    )


def run_load(spec: LoadSpec) -> LoadResult:
    if spec.kind in CLIENT_KINDS:
        return run_client_load(spec)
    from benchmarks.clients import run_streams
    from benchmarks.processes import percentile
    from udfserve.protocol.arrow_ipc import encode_batch

    if spec.kind == "encode":
        batch = make_batch(spec.rows)

        def make_payload(_index: int) -> tuple[bytes, int]:
            return encode_batch(batch), spec.rows

    elif spec.kind == "preencoded":
        cycle = itertools.cycle([encode_batch(make_batch(spec.rows, seed)) for seed in range(PAYLOADS)])

        def make_payload(_index: int) -> tuple[bytes, int]:
            return next(cycle), spec.rows

    else:
        raise ValueError(
            f"unknown load kind {spec.kind!r}; expected 'encode', 'preencoded' or one of {CLIENT_KINDS}"
        )
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall_s, stats = asyncio.run(
        run_streams(
            spec.target,
            spec.model,
            make_payload,
            streams=spec.streams,
            in_flight=spec.in_flight,
            duration_s=spec.duration_s,
            decode=spec.kind == "encode",
            max_message_bytes=spec.max_message_bytes,
            warmup_requests=spec.warmup_requests,
            metadata=spec.metadata(),
            start_at_epoch_s=spec.start_at_epoch_s,
            resend_exhausted=spec.resend_exhausted,
        )
    )
    after = resource.getrusage(resource.RUSAGE_SELF)
    return LoadResult(
        wall_s=wall_s,
        requests=stats.requests,
        rows=stats.rows,
        request_bytes=stats.request_bytes,
        p50_ms=percentile(stats.latencies_s, 50) * 1e3,
        p99_ms=percentile(stats.latencies_s, 99) * 1e3,
        # includes the warm-up requests: a small share next to a run of seconds
        cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        minor_faults=after.ru_minflt - before.ru_minflt,
        resends=stats.resends,
    )


def start_in_child(spec: LoadSpec, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the client; ``finish`` waits for it. Separate so a profiler can attach in between."""
    from benchmarks.processes import child_env

    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.load_client", json.dumps(asdict(spec))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(env),
    )


def finish(process: subprocess.Popen[str], spec: LoadSpec) -> LoadResult:
    try:
        stdout, stderr = process.communicate(timeout=spec.duration_s + 300)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(
            f"load client against {spec.target} failed with exit code {process.returncode}: {stderr[-2000:]}"
        )
    data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return LoadResult(**data)


def run_in_child(spec: LoadSpec, env: Mapping[str, str] | None = None) -> LoadResult:
    return finish(start_in_child(spec, env), spec)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    result = run_load(LoadSpec(**json.loads(args[0])))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
