"""What every udfserve process sets up once at start: its logging, and how SIGTERM and SIGINT
reach its event loop. The model server, the node supervisor and the CLI all take them from here,
so each process logs in one format (``log_format``: text, or one JSON object a line) and stops
through one idiom."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

from udfserve.services.log_context import LogIds
from udfserve.services.log_format import LogFormat, formatter
from udfserve.services.log_limits import LogLimits

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """One handler on stderr in ``log_format``, within the bounds of ``log_limits``: line length
    and tracebacks.

    In the JSON format every line the process writes itself must be an object, so Python's
    warnings and the traceback of an exception no code caught (in any thread) are logged too,
    instead of printed as text; the request, model, application and trace ids are added where
    known (``log_context``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(LogLimits())
    if log_format == "json":
        handler.addFilter(LogIds())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    json_lines = log_format == "json"
    logging.captureWarnings(json_lines)
    sys.excepthook = _log_uncaught if json_lines else sys.__excepthook__
    threading.excepthook = _log_uncaught_in_thread if json_lines else threading.__excepthook__


def _log_uncaught(kind: type[BaseException], exc: BaseException, traceback: TracebackType | None) -> None:
    logging.getLogger("udfserve").critical("uncaught exception", exc_info=(kind, exc, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return  # as threading's own hook: a thread that exits is no fault
    thread = args.thread.name if args.thread is not None else "a thread"
    logging.getLogger("udfserve").critical(
        "uncaught exception in thread %s",
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


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
