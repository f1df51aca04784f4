"""A model call that its framework cannot stop (a TensorFlow ``while_loop`` of 10**12 iterations:
TensorFlow has no means to stop a running call from outside) never holds the server for good:

- past the bound (``--model-call-timeout-s``) and the few seconds a stop is given, what the model
  holds fails UNAVAILABLE and the server exits with ``EXIT_UNRECOVERABLE`` for its supervisor to
  start a fresh process, the only way to get the thread back;
- after SIGTERM, with no bound, the server exits by its deadline (the grace period plus
  ``--exit-timeout-s``) with ``EXIT_FORCED``. Before, it logged "stopped" and never exited."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from server_harness import batch_of, request, stream_predict, wait_for_a_running_call

from udfserve.runtime.call_bound import STUCK_AFTER_S
from udfserve.services.model_server.app import EXIT_UNRECOVERABLE
from udfserve.services.model_server.exit_deadline import EXIT_FORCED
from udfserve.services.model_server.launcher import ServerProcess, launch_server

pytestmark = pytest.mark.slow

logger = logging.getLogger(__name__)

MODEL = "looping"
FOR_EVER = 10**12
SAFETY_TIMEOUT_S = 180.0
"""Safety limit of a call or a wait; each test ends at its event well before."""
GRACE_S = 1.0
EXIT_TIMEOUT_S = 2.0
BOUND_S = 2.0
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tf-looping")
    subprocess.run(
        [sys.executable, str(TESTS_DIR / "looping_savedmodel.py"), str(root / MODEL / "1")],
        check=True,
        capture_output=True,
        timeout=SAFETY_TIMEOUT_S,
    )
    return root


class NeverAnsweredCall:
    """A request of 10**12 iterations on its own stream, in a thread: how its call ended."""

    def __init__(self, server: ServerProcess) -> None:
        self.ended: list[grpc.StatusCode] = []
        self.message = ""
        self._thread = threading.Thread(
            target=self._call, args=(server.grpc_target(),), name="never-answered"
        )
        self._thread.start()

    def _call(self, target: str) -> None:
        batch = batch_of({"steps": np.array([[FOR_EVER]], dtype=np.int64)})
        try:
            answer = stream_predict(target, [request(MODEL, batch)], timeout_s=SAFETY_TIMEOUT_S)[0]
            self.ended.append(answer.code)
            self.message = answer.message
        except grpc.RpcError as exc:
            self.ended.append(exc.code())

    def join(self) -> None:
        self._thread.join(SAFETY_TIMEOUT_S)


def start(repository: Path, socket_dir: Path, log_path: Path, flags: Sequence[str]) -> ServerProcess:
    return launch_server(
        repository,
        socket=socket_dir / f"{log_path.parent.name}.sock",
        extra_args=["--grace-period-s", str(GRACE_S), "--exit-timeout-s", str(EXIT_TIMEOUT_S), *flags],
        log_path=log_path,
        ready_timeout_s=SAFETY_TIMEOUT_S,
    )


def test_a_call_past_the_bound_that_cannot_be_stopped_fails_unavailable_and_the_server_exits_for_a_fresh_one(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_path = tmp_path_factory.mktemp("unstoppable-bound") / "server.log"
    process = start(repository, socket_dir, log_path, ["--model-call-timeout-s", str(BOUND_S)])
    try:
        call = NeverAnsweredCall(process)
        call.join()
        code = process.process.wait(timeout=SAFETY_TIMEOUT_S)
    finally:
        process.terminate()
    log = log_path.read_text()
    assert call.ended == [grpc.StatusCode.UNAVAILABLE], log[-2000:]
    assert (
        f"its batcher failed (a model call ran past its bound of {BOUND_S:g} s and did not stop within "
        f"{STUCK_AFTER_S:g} s after)" in call.message
    )
    assert code == EXIT_UNRECOVERABLE, log[-2000:]
    assert "its backend cannot stop it" in log
    assert f"exiting now with code {EXIT_UNRECOVERABLE}" in log  # its thread never ends


def test_after_sigterm_a_server_whose_call_cannot_be_stopped_exits_by_its_deadline(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_path = tmp_path_factory.mktemp("unstoppable-exit") / "server.log"
    process = start(repository, socket_dir, log_path, ["--model-call-timeout-s", "0"])
    try:
        assert process.http_address is not None
        call = NeverAnsweredCall(process)
        wait_for_a_running_call(process.http_address, SAFETY_TIMEOUT_S)
        process.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = process.process.wait(timeout=SAFETY_TIMEOUT_S)
        exited_after_s = time.monotonic() - signalled
        call.join()
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
    assert code == EXIT_FORCED, log[-2000:]
    assert f"exiting now with code {EXIT_FORCED}" in log
    assert call.ended == [grpc.StatusCode.UNAVAILABLE]  # the drain ended the call before the exit
