"""Load generators: Predict streams driven by ``grpc.aio`` from one process.

A stream keeps ``in_flight`` requests outstanding (a request is sent as soon as an answer frees a
slot) until ``duration_s`` has passed, and records the latency of every answered request from
just before it was written to just after its answer was read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pyarrow as pa

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch

_CODES = {code.value[0]: code.name for code in grpc.StatusCode}


class BenchmarkRequestFailed(RuntimeError):
    """The server answered a benchmark request with an error: the run is not valid."""


@dataclass
class StreamStats:
    requests: int = 0
    rows: int = 0
    request_bytes: int = 0
    resends: int = 0
    """Requests sent again after RESOURCE_EXHAUSTED (``resend_exhausted``)."""
    latencies_s: list[float] = field(default_factory=list)


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


async def run_stream(
    stub: pb_grpc.InferenceStub,
    model: str,
    make_payload: Callable[[int], tuple[bytes, int]],
    *,
    in_flight: int,
    deadline: float,
    decode: bool,
    stats: StreamStats,
    metadata: tuple[tuple[str, str], ...] = (),
    resend_exhausted: bool = False,
) -> None:
    """Drive one Predict stream until ``deadline`` (``time.perf_counter``); answers are checked.

    ``make_payload(i)`` returns the Arrow IPC bytes of request ``i`` and its row count; its cost
    counts as client time, as it would in a real client. With ``decode`` every answer is turned
    back into a record batch (zero-copy) and its row count checked. With ``resend_exhausted`` a
    request answered RESOURCE_EXHAUSTED is sent again after a back-off (10 ms, doubling up to 1 s),
    as the Spark client does, keeping its slot; any other error fails the stream.
    """
    call = stub.Predict(metadata=metadata)
    slots = asyncio.Semaphore(in_flight)
    sent_at: dict[int, tuple[float, int]] = {}
    payloads: dict[int, bytes] = {}
    backoffs: dict[int, float] = {}
    one_writer = asyncio.Lock()
    resends: set[asyncio.Task[None]] = set()
    sent = 0

    async def send(batch_id: int, payload: bytes) -> None:
        async with one_writer:
            await call.write(pb.PredictRequest(model=model, batch_id=batch_id, arrow_ipc=payload))
        stats.request_bytes += len(payload)

    async def resend_after(batch_id: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        stats.resends += 1
        await send(batch_id, payloads[batch_id])

    async def write() -> None:
        nonlocal sent
        while True:
            await slots.acquire()
            if time.perf_counter() >= deadline:
                break
            payload, rows = make_payload(sent)
            sent_at[sent] = (time.perf_counter(), rows)
            if resend_exhausted:
                payloads[sent] = payload
            await send(sent, payload)
            sent += 1
        if resend_exhausted:  # every request answered (a resend keeps its slot) before the stream ends
            for _ in range(in_flight - 1):
                await slots.acquire()
        await call.done_writing()

    writer = asyncio.create_task(write())
    answered = 0
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            break
        received = time.perf_counter()
        if (
            resend_exhausted
            and response.HasField("error")
            and _CODES.get(response.error.code) == "RESOURCE_EXHAUSTED"
        ):
            delay_s = min(backoffs.get(response.batch_id, 0.005) * 2, 1.0)
            backoffs[response.batch_id] = delay_s
            task = asyncio.create_task(resend_after(response.batch_id, delay_s))
            resends.add(task)
            task.add_done_callback(resends.discard)
            continue
        if response.HasField("error"):
            writer.cancel()
            raise BenchmarkRequestFailed(
                f"model {model!r} batch {response.batch_id}: {_CODES.get(response.error.code)} "
                f"{response.error.message}"
            )
        started, rows = sent_at.pop(response.batch_id)
        payloads.pop(response.batch_id, None)
        backoffs.pop(response.batch_id, None)
        if decode:
            outputs: pa.RecordBatch = decode_batch(response.arrow_ipc)
            if outputs.num_rows != rows:
                raise BenchmarkRequestFailed(
                    f"model {model!r} batch {response.batch_id}: expected {rows} rows back, "
                    f"received {outputs.num_rows}"
                )
        stats.latencies_s.append(received - started)
        stats.requests += 1
        stats.rows += rows
        answered += 1
        slots.release()
    await writer


async def run_streams(
    target: str,
    model: str,
    make_payload: Callable[[int], tuple[bytes, int]],
    *,
    streams: int,
    in_flight: int,
    duration_s: float,
    decode: bool,
    max_message_bytes: int = 256 << 20,
    warmup_requests: int = 2,
    metadata: tuple[tuple[str, str], ...] = (),
    start_at_epoch_s: float = 0.0,
    resend_exhausted: bool = False,
) -> tuple[float, StreamStats]:
    """``streams`` concurrent clients for ``duration_s``; returns (wall_s, stats of all of them).

    Each client has its own channel and connection (a local subchannel pool: gRPC would otherwise
    share one connection between channels to the same target), as separate Spark tasks would.
    Each first sends ``warmup_requests`` alone (connection set-up, first-call costs), not counted.
    ``metadata`` goes on every stream (a Spark application's ``udfserve-spark-*`` keys);
    ``start_at_epoch_s`` (wall-clock time), when later than the warm-up's end, is when the timed
    run starts, so that clients of several processes load the server over the same window.
    ``resend_exhausted``: see ``run_stream``.
    """
    options = [*channel_options(max_message_bytes), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(streams)]
    try:
        stubs = [pb_grpc.InferenceStub(channel) for channel in channels]
        for stub in stubs:
            for _ in range(warmup_requests):
                await one_request(stub, model, make_payload, metadata)
        await asyncio.sleep(max(0.0, start_at_epoch_s - time.time()))
        stats = StreamStats()
        started = time.perf_counter()
        deadline = started + duration_s
        await asyncio.gather(
            *(
                run_stream(
                    stub,
                    model,
                    make_payload,
                    in_flight=in_flight,
                    deadline=deadline,
                    decode=decode,
                    stats=stats,
                    metadata=metadata,
                    resend_exhausted=resend_exhausted,
                )
                for stub in stubs
            )
        )
        return time.perf_counter() - started, stats
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


async def one_request(
    stub: pb_grpc.InferenceStub,
    model: str,
    make_payload: Callable[[int], tuple[bytes, int]],
    metadata: tuple[tuple[str, str], ...] = (),
) -> float:
    """One request on its own stream; returns its latency in seconds."""
    payload, _rows = make_payload(0)
    started = time.perf_counter()
    call = stub.Predict(metadata=metadata)
    await call.write(pb.PredictRequest(model=model, batch_id=0, arrow_ipc=payload))
    await call.done_writing()
    response = await call.read()
    latency = time.perf_counter() - started
    if response is grpc.aio.EOF or response.HasField("error"):
        detail = "no answer" if response is grpc.aio.EOF else response.error.message
        raise BenchmarkRequestFailed(f"model {model!r}: warm-up request failed: {detail}")
    while await call.read() is not grpc.aio.EOF:
        pass
    return latency
