"""What every udfserve process sets up once at start: its logging, and how SIGTERM and SIGINT
reach its event loop. The model server, the node supervisor and the CLI all take them from here,
so each process logs in one format and stops through one idiom."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

from udfserve.services.log_limits import LogLimits

LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d %(name)s] %(message)s"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def configure_logging(level: str) -> None:
    """One format on stderr, within the bounds of ``log_limits``: line length and tracebacks."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(LogLimits())


@contextlib.contextmanager
def stop_on_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``on_signal`` in the running event loop; restore the previous
    handlers on the way out, so nothing of the process's own handling outlives the block."""
    loop = asyncio.get_running_loop()

    def handler(signum: int, _frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(on_signal, signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
