"""A stream's requests that find the model's queue full wait in the server for room, by default.

The server is the same as test_queue_and_health.py's (``sequence_bilstm`` with room for two
8-row requests in its queue) without ``--room-wait-s 0``: a burst on one stream is read one
request at a time, each that does not fit waits until rows leave the queue, and none is refused.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from server_harness import batch_of, metric_value, request, scrape, stream_predict, wait_until_idle

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server

MODEL = "sequence_bilstm"
ROWS_PER_REQUEST = 8
BURST = 120


@pytest.fixture(scope="module")
def small_queue_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("room-wait-repo")
    shutil.copytree(example_repository / MODEL, repository / MODEL)
    config = {
        "max_batch_size": ROWS_PER_REQUEST,
        "dynamic_batching": {"max_queue_delay_s": 0.001, "max_queue_rows": 2 * ROWS_PER_REQUEST},
    }
    (repository / MODEL / "config.yaml").write_text(yaml.safe_dump(config))
    process = launch_server(
        repository, socket=socket_dir / "room.sock", log_path=repository.parent / "room.log"
    )
    yield process
    process.terminate()


def burst(count: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    lines = rng.normal(size=(count, ROWS_PER_REQUEST, 16, 32)).astype("f4")
    return [request(MODEL, batch_of({"lines": lines[i]}), i) for i in range(count)]


def counts(server: ServerProcess) -> tuple[float, float, float]:
    """Requests refused RESOURCE_EXHAUSTED, answered OK, and held for room, so far."""
    text = scrape(server.http_address)
    return (
        metric_value(text, "udfserve_requests_total", model=MODEL, code="RESOURCE_EXHAUSTED"),
        metric_value(text, "udfserve_requests_total", model=MODEL, code="OK"),
        metric_value(text, "udfserve_queue_room_wait_seconds_count", model=MODEL),
    )


def test_a_burst_past_the_queue_on_one_stream_is_answered_without_a_refusal(
    small_queue_server: ServerProcess,
) -> None:
    refused_before, ok_before, held_before = counts(small_queue_server)
    answers = stream_predict(small_queue_server.grpc_target(), burst(BURST))
    assert sorted(answers) == list(range(BURST))
    assert {answer.code for answer in answers.values()} == {grpc.StatusCode.OK}
    refused, ok, held = counts(small_queue_server)
    assert (refused - refused_before, ok - ok_before) == (0, BURST)
    assert held > held_before, "no request waited for room: the burst did not fill the queue"


def test_streams_that_leave_while_their_requests_wait_for_room_leave_nothing_in_flight(
    small_queue_server: ServerProcess,
) -> None:
    """Each stream is cancelled once its first answer came: its later requests were waiting for
    room or queued; the server drops them, counts nothing in flight, and serves the next stream."""
    requests = burst(BURST, seed=1)
    with grpc.insecure_channel(small_queue_server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for _ in range(4):
            call = stub.Predict(iter(requests), timeout=120)
            next(call)
            call.cancel()
    wait_until_idle(small_queue_server.http_address)  # nothing in flight, no row queued
    answers = stream_predict(small_queue_server.grpc_target(), burst(4, seed=2))
    assert {answer.code for answer in answers.values()} == {grpc.StatusCode.OK}
