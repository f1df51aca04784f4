"""The server's last resort on the way out: it exits by a deadline, whatever its threads do.

A drain answers what it can within the grace period, but Python's exit then joins every
inference thread, and a thread inside a model call that cannot be stopped (native code of
TensorFlow or PyTorch, a call that ignores its stop) would hold the process for ever: it logged
"stopped" and never exited. Once a stop begins, ``arm`` starts a daemon timer; at the grace
period plus ``--exit-timeout-s`` it logs which threads still run, flushes the logs and ends the
process with ``os._exit``, as Triton's ``--exit-timeout-secs`` does. A clean exit before then
never sees it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn

logger = logging.getLogger(__name__)

EXIT_FORCED = 71
"""The exit code of a process that its deadline ended after a stop it was asked for (SIGTERM, its
parent gone): not a clean drain (0). A server stopping for a fault of its own (a call that could
not be stopped) keeps that exit code (``app.EXIT_UNRECOVERABLE``, 70) when the deadline ends it."""


class ExitDeadline:
    """Armed once, when a stop begins; the process ends at ``seconds`` after that."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self, seconds: float, code: int = EXIT_FORCED) -> None:
        """End the process with ``code`` ``seconds`` from now, unless it ended before; the first
        arm counts."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(seconds, _force_exit, args=(seconds, code))
        self._timer.name = "exit-deadline"
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        """For a caller that stopped cleanly and goes on in the same process (tests)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _force_exit(seconds: float, code: int) -> None:
    running = sorted(
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.current_thread() and not thread.daemon and thread.is_alive()
    )
    logger.error(
        "still running %.1f s after the stop began (threads: %s); exiting now with code %d",
        seconds,
        ", ".join(running) or "none",
        code,
    )
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's teardown, logs and standard streams
    flushed first: for a deadline past, and for a server that drained and stopped, whose teardown
    (freeing TensorFlow's, PyTorch's and gRPC's objects one by one) took 1.1-2.5 s of a 2-core
    machine per stop while a supervisor's restart or a rollout waited on it."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
