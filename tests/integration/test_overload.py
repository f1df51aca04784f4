"""Overload: 64 concurrent Predict streams against one server whose queue holds 128 rows, for a
bounded time. Every request is answered OK or refused with RESOURCE_EXHAUSTED; every refusal is
retried by the client with exponential back-off until answered; no row is lost, duplicated or
mixed up with another request's; the server does not crash and its memory stays bounded.

The figures (requests, refusals, retries, rows, peak memory over the baseline) are logged at INFO
(``pytest --log-cli-level=INFO``) and reported in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import yaml
from server_harness import batch_of, column_to_numpy, metric_value, request, scrape, stream_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch, encode_batch
from udfserve.services.model_server.launcher import ServerProcess, launch_server

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

MODEL = "tabular_mlp"
STREAMS = 64
CHANNELS = 8
IN_FLIGHT_PER_STREAM = 2
SENDING_S = 12.0  # new requests are started for this long; then retries finish
MAX_BATCH_SIZE = 64
MAX_QUEUE_ROWS = 128
POOL_SIZE = 16  # distinct inputs, so every answer can be checked against a reference
INITIAL_BACKOFF_S = 0.005
MAX_BACKOFF_S = 0.5
MEMORY_BOUND_BYTES = 1 << 30
SAMPLE_EVERY_S = 0.1
_CODES = {code.value[0]: code for code in grpc.StatusCode}


@pytest.fixture(scope="module")
def small_queue_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("overload-repository")
    shutil.copytree(tabular_onnx_repository / MODEL, repository / MODEL)
    config = {
        "max_batch_size": MAX_BATCH_SIZE,
        "dynamic_batching": {"max_queue_delay_s": 0.002, "max_queue_rows": MAX_QUEUE_ROWS},
    }
    (repository / MODEL / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    # --room-wait-s 0: the streams' requests past the queue are refused, not held, so that the
    # test overloads the refusal path (the held path: test_room_waits.py)
    process = launch_server(
        repository,
        socket=socket_dir / "overload.sock",
        log_path=repository.parent / "overload-server.log",
        extra_args=["--room-wait-s", "0"],
    )
    yield process
    assert process.terminate() == 0


@dataclass
class Figures:
    requests: int = 0
    attempts: int = 0
    refusals: int = 0
    rows_sent: int = 0
    rows_answered: int = 0
    longest_backoff_s: float = 0.0
    other_codes: list[str] = field(default_factory=list)
    wrong_answers: list[str] = field(default_factory=list)


class MemorySampler:
    """Samples a process's resident memory in a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.baseline_bytes = self._process.memory_info().rss
        self.peak_bytes = self.baseline_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):  # the sampling period, not a synchronisation
            self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)


class Stream:
    """One Predict stream with several requests in flight; answers are matched by batch id."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._write_lock = asyncio.Lock()
        self._waiting: dict[int, asyncio.Future[pb.PredictResponse]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self._call:
            future = self._waiting.pop(response.batch_id)
            future.set_result(response)

    async def send(self, message: pb.PredictRequest) -> pb.PredictResponse:
        future = asyncio.get_running_loop().create_future()
        self._waiting[message.batch_id] = future
        async with self._write_lock:
            await self._call.write(message)
        return await future

    async def close(self) -> None:
        await self._call.done_writing()
        await self._reader


@dataclass
class Pool:
    """Distinct inputs and the outputs the quiet server gave for them."""

    inputs: list[np.ndarray]
    payloads: list[bytes]
    expected: list[np.ndarray]


def calibrate(server: ServerProcess) -> Pool:
    rng = np.random.default_rng(2024)
    inputs = [rng.normal(size=(int(rng.integers(1, 33)), 64)).astype(np.float32) for _ in range(POOL_SIZE)]
    # One at a time: together they would overflow the small queue.
    answers = {
        i: stream_predict(server.grpc_target(), [request(MODEL, batch_of({"features": x}), i)])[i]
        for i, x in enumerate(inputs)
    }
    expected = []
    for i in range(POOL_SIZE):
        assert answers[i].code == grpc.StatusCode.OK and answers[i].outputs is not None, answers[i].message
        expected.append(column_to_numpy(answers[i].outputs.column("probabilities")))
    payloads = [encode_batch(batch_of({"features": x})) for x in inputs]
    return Pool(inputs, payloads, expected)


async def lane(
    stream: Stream, lane_id: int, pool: Pool, figures: Figures, stop_sending_at: float, rng: random.Random
) -> None:
    """Send requests one after the other until the sending time is over, retrying each refusal."""
    loop = asyncio.get_running_loop()
    sequence = 0
    while loop.time() < stop_sending_at:
        choice = rng.randrange(POOL_SIZE)
        batch_id = lane_id * 1_000_000 + sequence
        sequence += 1
        figures.requests += 1
        figures.rows_sent += len(pool.inputs[choice])
        backoff_s = INITIAL_BACKOFF_S
        while True:
            figures.attempts += 1
            response = await stream.send(
                pb.PredictRequest(model=MODEL, batch_id=batch_id, arrow_ipc=pool.payloads[choice])
            )
            code = _CODES[response.error.code] if response.HasField("error") else grpc.StatusCode.OK
            if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                break
            figures.refusals += 1
            figures.longest_backoff_s = max(figures.longest_backoff_s, backoff_s)
            await asyncio.sleep(backoff_s * rng.uniform(0.5, 1.0))  # jittered exponential back-off
            backoff_s = min(2 * backoff_s, MAX_BACKOFF_S)
        if code != grpc.StatusCode.OK:
            figures.other_codes.append(f"{batch_id}: {code.name} {response.error.message}")
            continue
        outputs = column_to_numpy(decode_batch(response.arrow_ipc).column("probabilities"))
        if outputs.shape != pool.expected[choice].shape or not np.allclose(
            outputs, pool.expected[choice], atol=1e-5
        ):
            figures.wrong_answers.append(f"{batch_id}: input {choice}, output shape {outputs.shape}")
            continue
        figures.rows_answered += len(outputs)


async def overload(target: str, pool: Pool) -> Figures:
    figures = Figures()
    rng = random.Random(64)
    channels = [grpc.aio.insecure_channel(target) for _ in range(CHANNELS)]
    try:
        stop_sending_at = asyncio.get_running_loop().time() + SENDING_S
        streams = [Stream(pb_grpc.InferenceStub(channels[i % CHANNELS]).Predict()) for i in range(STREAMS)]
        lanes = [
            lane(
                stream,
                s * IN_FLIGHT_PER_STREAM + k,
                pool,
                figures,
                stop_sending_at,
                random.Random(rng.random()),
            )
            for s, stream in enumerate(streams)
            for k in range(IN_FLIGHT_PER_STREAM)
        ]
        await asyncio.gather(*lanes)
        await asyncio.gather(*(stream.close() for stream in streams))
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return figures


@dataclass
class Run:
    figures: Figures
    baseline_bytes: int
    peak_bytes: int
    server_refusals: float
    server_ok: float
    calibration_requests: int


@pytest.fixture(scope="module")
def overload_run(small_queue_server: ServerProcess) -> Run:
    pool = calibrate(small_queue_server)
    with MemorySampler(small_queue_server.pid) as memory:
        figures = asyncio.run(overload(small_queue_server.grpc_target(), pool))
    metrics = scrape(small_queue_server.http_address or "")
    run = Run(
        figures=figures,
        baseline_bytes=memory.baseline_bytes,
        peak_bytes=memory.peak_bytes,
        server_refusals=metric_value(
            metrics, "udfserve_requests_total", model=MODEL, code="RESOURCE_EXHAUSTED"
        ),
        server_ok=metric_value(metrics, "udfserve_requests_total", model=MODEL, code="OK"),
        calibration_requests=POOL_SIZE,
    )
    logger.info(
        "overload: %d streams for %.0f s: %d requests, %d attempts, %d refusals (all retried), "
        "longest back-off %.3f s, %d rows sent, %d answered, %d lost; server RSS %.0f MiB before, "
        "peak %.0f MiB (+%.0f MiB)",
        STREAMS,
        SENDING_S,
        figures.requests,
        figures.attempts,
        figures.refusals,
        figures.longest_backoff_s,
        figures.rows_sent,
        figures.rows_answered,
        figures.rows_sent - figures.rows_answered,
        run.baseline_bytes / 2**20,
        run.peak_bytes / 2**20,
        (run.peak_bytes - run.baseline_bytes) / 2**20,
    )
    return run


def test_every_request_is_answered_ok_or_refused_and_nothing_else(overload_run: Run) -> None:
    figures = overload_run.figures
    assert figures.other_codes == []
    assert figures.requests > STREAMS
    assert figures.refusals > 0, "the queue never filled: the test did not overload the server"


def test_every_refused_request_is_retried_to_completion_and_no_row_is_lost(overload_run: Run) -> None:
    figures = overload_run.figures
    assert figures.attempts == figures.requests + figures.refusals
    assert figures.wrong_answers == []
    assert figures.rows_answered == figures.rows_sent


def test_the_server_counted_exactly_the_answers_the_clients_saw(overload_run: Run) -> None:
    figures = overload_run.figures
    assert overload_run.server_refusals == figures.refusals
    assert overload_run.server_ok == figures.requests + overload_run.calibration_requests


def test_server_memory_stays_bounded_and_it_keeps_serving(
    overload_run: Run, small_queue_server: ServerProcess
) -> None:
    assert overload_run.peak_bytes < overload_run.baseline_bytes + MEMORY_BOUND_BYTES
    assert small_queue_server.process.poll() is None
    answer = stream_predict(
        small_queue_server.grpc_target(),
        [request(MODEL, batch_of({"features": np.ones((3, 64), np.float32)}))],
    )[0]
    assert answer.code == grpc.StatusCode.OK
