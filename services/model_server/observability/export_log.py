"""How often a server's log speaks of a collector it cannot export spans to.

The OTLP exporter logs each export that fails: a warning for each retry ("Transient error ...
retrying in 2s") and an error when it gives the batch up ("Failed to export traces ..."). Spans
are exported in batches every few seconds, so a collector that is down for an hour writes
hundreds of the same two lines, whatever the request rate. The SDK's own filter drops only a line
that repeats the one just before, which these two alternating lines never do.

``ExportFailureLog`` lets each kind of line (its message template) through once, then at most
once per ``WINDOW_S``, and the line it lets through says how many of its kind were left out
since the last: the first failure is in the log at once, and a collector that stays down costs
two lines per window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"
"""The logger the OTLP/gRPC exporter writes its export failures to."""
WINDOW_S = 300.0


class ExportFailureLog(logging.Filter):
    """Each message template of a warning or worse: once, then at most once per ``window_s``."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_written: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        template = str(record.msg)
        now = self._clock()
        with self._lock:
            last = self._last_written.get(template)
            if last is not None and now - last < self._window_s:
                self._left_out[template] = self._left_out.get(template, 0) + 1
                return False
            self._last_written[template] = now
            left_out = self._left_out.pop(template, 0)
        if left_out and last is not None:
            # the template's % placeholders stay for record.args; the note holds no %
            record.msg = f"{template} ({left_out} more like this left out in the last {now - last:.0f}s)"
        return True


def bound_export_failure_log(window_s: float = WINDOW_S) -> None:
    """Put an ``ExportFailureLog`` on the OTLP exporter's logger, once per process."""
    logger = logging.getLogger(EXPORTER_LOGGER)
    if not any(isinstance(existing, ExportFailureLog) for existing in logger.filters):
        logger.addFilter(ExportFailureLog(window_s))
