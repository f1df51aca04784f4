"""Lifecycle of one model server process: listen, load every model once, serve, drain.

``serve`` starts a ``RunningServer`` (``server.py``: its listeners, models and health), runs it
until SIGTERM or SIGINT, then stops accepting, answers every accepted request within the grace
period and returns 0; whatever still runs then, the process ends within ``--exit-timeout-s`` more
(``exit_deadline``). It drains the same way, and returns 0, when the process that started it dies
(``--lifeline-fd``, ``lifeline.py``), and returns ``EXIT_UNRECOVERABLE`` after draining when a
fault leaves it unable to serve (a model's batcher broke for good): health turns NOT_SERVING at
once, and a supervisor restarts the process, the only way to serve that model again.
The device must be pinned (``device.pin_device``) before this module loads a model.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import prometheus_client

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.exit_deadline import EXIT_FORCED, ExitDeadline
from udfserve.services.model_server.lifeline import watch_lifeline
from udfserve.services.model_server.observability import tracing as server_tracing
from udfserve.services.model_server.server import RunningServer
from udfserve.services.process_setup import stop_on_signals

logger = logging.getLogger(__name__)

EXIT_UNRECOVERABLE = 70
"""The exit code after an unrecoverable fault (sysexits' EX_SOFTWARE): restart the process."""


async def serve(config: ServerConfig) -> int:
    """Run one model server until SIGTERM/SIGINT; return the process exit code."""
    prometheus_client.disable_created_metrics()
    server = RunningServer(config)
    stop = asyncio.Event()
    deadline = ExitDeadline()

    def stopping(code: int = EXIT_FORCED) -> None:
        stop.set()
        deadline.arm(config.grace_period_s + config.exit_timeout_s, code)

    def on_signal(signum: int) -> None:
        logger.info("received %s", signal.Signals(signum).name)
        stopping()

    def on_fault(reason: str) -> None:
        logger.error(
            "unrecoverable fault: %s; draining, then exiting with code %d for a fresh process to serve",
            reason,
            EXIT_UNRECOVERABLE,
        )
        stopping(EXIT_UNRECOVERABLE)

    def on_parent_gone() -> None:
        logger.warning("the process that started this server is gone (--lifeline-fd closed); draining")
        stopping()

    server.models.on_fault = on_fault
    server_tracing.install(config, config.device)
    with stop_on_signals(on_signal):
        try:
            if config.lifeline_fd is not None:
                watch_lifeline(config.lifeline_fd, on_parent_gone)
            await server.start()
        except OSError as exc:  # an address or socket this server cannot take: the message says which
            logger.error("refusing to start: %s", exc)
            await server.close_listeners()
            return 2
        await stop.wait()
        await server.drain_and_stop()
        server_tracing.shutdown()
    return EXIT_UNRECOVERABLE if server.models.fault else 0
