"""SIGTERM drains: every accepted request is answered and the process exits 0 in the grace period."""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from idle_stream import IdleStream
from server_harness import _CODES, batch_of, request

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import launch_server

GRACE_PERIOD_S = 20.0
BATCHES = 40
REQUESTS_IN_FLIGHT = 24


@pytest.mark.slow
@pytest.mark.parametrize("event_loop", ["auto", "asyncio"])
def test_sigterm_during_a_stream_answers_every_request_and_exits_zero(
    example_repository: Path, socket_dir: Path, tmp_path: Path, event_loop: str
) -> None:
    server = launch_server(
        example_repository,
        socket=socket_dir / f"drain-{event_loop}.sock",
        port=None,
        http_port=None,
        extra_args=[
            *("--models", "sequence_bilstm", "--grace-period-s", str(GRACE_PERIOD_S)),
            *("--event-loop", event_loop),
        ],
        log_path=tmp_path / "server.log",
    )
    rng = np.random.default_rng(0)
    requests = [
        request("sequence_bilstm", batch_of({"lines": rng.normal(size=(256, 16, 32)).astype(np.float32)}), i)
        for i in range(BATCHES)
    ]
    answers: dict[int, grpc.StatusCode] = {}
    rows: dict[int, int] = {}
    with grpc.insecure_channel(server.grpc_target()) as channel:
        stream = pb_grpc.InferenceStub(channel).Predict(iter(requests), timeout=120)
        for response in stream:
            if not answers:
                os.kill(server.pid, signal.SIGTERM)
                signalled_at = time.monotonic()
            code = _CODES[response.error.code] if response.HasField("error") else grpc.StatusCode.OK
            answers[response.batch_id] = code
            rows[response.batch_id] = len(response.arrow_ipc)
    exit_code = server.process.wait(timeout=GRACE_PERIOD_S + 10)
    assert exit_code == 0
    assert time.monotonic() - signalled_at < GRACE_PERIOD_S + 10
    assert sorted(answers) == list(range(BATCHES)), "every request sent on the stream got an answer"
    assert set(answers.values()) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert grpc.StatusCode.OK in answers.values()
    assert all(rows[i] > 0 for i, code in answers.items() if code == grpc.StatusCode.OK)
    assert "draining" in server.log_tail()


@pytest.mark.slow
def test_statistics_are_answered_while_the_server_drains(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    """perf_analyzer and other KServe clients read a model's statistics after their last request:
    while a draining server answers the requests it accepted, it refuses new ones but still
    answers statistics."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    server = launch_server(
        example_repository,
        socket=socket_dir / "drain-statistics.sock",
        port=None,
        http_port=None,
        extra_args=["--models", "sequence_bilstm", "--grace-period-s", str(GRACE_PERIOD_S)],
        log_path=tmp_path / "server.log",
    )
    try:
        lines = np.random.default_rng(0).normal(size=(4096, 16, 32)).astype(np.float32)
        answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        with triton.InferenceServerClient(server.grpc_target()) as client:
            infer_input = triton.InferInput("lines", list(lines.shape), "FP32").set_data_from_numpy(lines)
            for _ in range(REQUESTS_IN_FLIGHT):  # several times what the first answer takes
                client.async_infer(
                    "sequence_bilstm", [infer_input], lambda result, error: answers.put(error or result)
                )
            outcomes = [answers.get(timeout=GRACE_PERIOD_S)]  # the server is busy with the others
            # Open until the statistics are read: a draining server with an open stream stays up
            # (within its grace period) however quickly it answered what it had accepted, as a
            # loaded machine can leave few requests sent by the time the first is answered.
            idle = IdleStream(server.grpc_target())
            try:
                os.kill(server.pid, signal.SIGTERM)
                deadline, draining = time.monotonic() + GRACE_PERIOD_S, False
                while not draining and time.monotonic() < deadline:
                    draining = not client.is_server_ready()
                assert draining, "the server reports not ready once it drains"
                statistics = client.get_inference_statistics("sequence_bilstm")
                with pytest.raises(InferenceServerException) as refused:
                    client.infer("sequence_bilstm", [infer_input])
            finally:
                idle.close()
            outcomes += [answers.get(timeout=GRACE_PERIOD_S) for _ in range(REQUESTS_IN_FLIGHT - 1)]
        assert server.process.wait(timeout=GRACE_PERIOD_S + 10) == 0
    finally:
        server.terminate()  # a no-op once it has exited
    (stats,) = statistics.model_stats
    assert stats.name == "sequence_bilstm"
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert len(outcomes) == REQUESTS_IN_FLIGHT  # answered, or refused if they came after the signal
