"""A model call that runs as long as its input says (an ONNX ``Loop`` of 10**12 iterations) is
stopped at the server's bound (``--model-call-timeout-s``): its request fails DEADLINE_EXCEEDED
naming the bound, the request merged with it is answered, and the model serves what comes next.
Without a bound such a call held the model's thread for good, and after SIGTERM the server logged
"stopped" and never exited; now the drain stops what still runs at the end of the grace period,
and the server exits cleanly (test_unstoppable_calls.py: a call no framework can stop)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnx_graphs import looping_graph, write_model
from server_harness import (
    Answer,
    batch_of,
    request,
    running_server,
    stream_predict,
    wait_for_a_running_call,
)

from udfserve.services.model_server.launcher import ServerProcess, launch_server

logger = logging.getLogger(__name__)

MODEL = "looping"
BOUND_S = 2.0
FOR_EVER = 10**12
"""Iterations of the ``Loop``: hours of one core."""
SAFETY_TIMEOUT_S = 120.0
"""Safety limit of a call or a wait; each test ends at its event well before."""
GRACE_S = 1.0
EXIT_TIMEOUT_S = 2.0


def steps(*values: int) -> dict[str, np.ndarray]:
    return {"steps": np.array([[value] for value in values], dtype=np.int64)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("looping")
    write_model(root, MODEL, looping_graph())
    return root


@pytest.fixture(scope="module")
def server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    flags = ["--model-call-timeout-s", str(BOUND_S)]
    with running_server(repository, socket_dir, tmp_path_factory, "call-bound", flags) as process:
        yield process


def predict(server: ServerProcess, *batches: dict[str, np.ndarray]) -> dict[int, Answer]:
    requests = [request(MODEL, batch_of(batch), batch_id=index) for index, batch in enumerate(batches)]
    return stream_predict(server.grpc_target(), requests, timeout_s=SAFETY_TIMEOUT_S)


def test_a_call_past_the_bound_fails_deadline_exceeded_naming_the_model_and_the_bound(
    server: ServerProcess,
) -> None:
    started = time.monotonic()
    answer = predict(server, steps(FOR_EVER))[0]
    logger.info("the call of 10**12 iterations was answered after %.1f s", time.monotonic() - started)
    assert answer.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (
        f"model '{MODEL}': the call of 1 row(s) ran past the server's bound of {BOUND_S:g} s on one model "
        "call and was stopped" in answer.message
    )


def test_the_model_serves_the_next_request_after_a_call_was_stopped(server: ServerProcess) -> None:
    assert predict(server, steps(FOR_EVER))[0].code == grpc.StatusCode.DEADLINE_EXCEEDED
    answer = predict(server, steps(3, 5))[0]
    assert answer.code == grpc.StatusCode.OK
    assert answer.outputs is not None
    assert answer.outputs.column("y").to_pylist() == [[8.0], [10.0]]


def test_a_stopped_call_fails_only_its_own_request(server: ServerProcess) -> None:
    answers = predict(server, steps(FOR_EVER), steps(2))
    assert answers[0].code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert answers[1].code == grpc.StatusCode.OK, answers[1].message
    assert answers[1].outputs is not None
    assert answers[1].outputs.column("y").to_pylist() == [[4.0]]


@pytest.mark.slow
def test_after_sigterm_a_call_without_a_bound_is_stopped_after_the_grace_period_and_the_server_exits(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_path = tmp_path_factory.mktemp("exit-deadline") / "server.log"
    flags = [
        "--model-call-timeout-s", "0",  # no bound: the call runs for hours
        "--grace-period-s", str(GRACE_S),
        "--exit-timeout-s", str(EXIT_TIMEOUT_S),
    ]  # fmt: skip
    process = launch_server(
        repository, socket=socket_dir / "exit-deadline.sock", extra_args=flags, log_path=log_path
    )
    ended: list[grpc.StatusCode] = []

    def never_answered() -> None:
        try:
            ended.append(predict(process, steps(FOR_EVER))[0].code)
        except grpc.RpcError as exc:
            ended.append(exc.code())

    try:
        assert process.http_address is not None
        client = threading.Thread(target=never_answered, name="never-answered")
        client.start()
        wait_for_a_running_call(process.http_address, SAFETY_TIMEOUT_S)
        process.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = process.process.wait(timeout=SAFETY_TIMEOUT_S)
        exited_after_s = time.monotonic() - signalled
        client.join(SAFETY_TIMEOUT_S)
    finally:
        process.terminate()
    logger.info(
        "exited %.1f s after SIGTERM (grace %g s + exit timeout %g s) with code %d",
        exited_after_s,
        GRACE_S,
        EXIT_TIMEOUT_S,
        code,
    )
    log = log_path.read_text()
    assert code == 0, log[-2000:]
    assert "stopped 1 model call(s) still running after the grace period" in log
    assert ended == [grpc.StatusCode.UNAVAILABLE]  # the call ended by the drain, before the exit
