"""Bounds on what one process's log can grow by, whatever its clients do.

Two limits sit on the handler every udfserve process logs through (``process_setup``):

- a log line is at most ``MAX_LINE_CHARS`` characters, cut with a note of its length: client
  text is clipped where it is logged (``udfserve.log_text.clip``), and this catches what reaches
  a line some other way (an exception's text that quotes a request);
- tracebacks are rate-limited: the first ``TRACEBACKS_PER_MINUTE`` in a minute are written
  whole, later ones as their one line, and the next traceback written says how many were left
  out. A fault that every request meets then costs one line per request, not a page.
"""

from __future__ import annotations

import logging
import threading
import time

MAX_LINE_CHARS = 8192
"""A line's message (before the traceback) is cut here; no message of the product is close."""
TRACEBACKS_PER_MINUTE = 10
WINDOW_S = 60.0


class LogLimits(logging.Filter):
    """The filter that applies both limits to every record of a handler."""

    def __init__(
        self,
        max_line_chars: int = MAX_LINE_CHARS,
        tracebacks_per_window: int = TRACEBACKS_PER_MINUTE,
        window_s: float = WINDOW_S,
    ) -> None:
        super().__init__()
        self._max_line_chars = max_line_chars
        self._tracebacks_per_window = tracebacks_per_window
        self._window_s = window_s
        self._lock = threading.Lock()
        self._window_start = time.monotonic()
        self._written = 0
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` within the limits; never drops one."""
        message = record.getMessage()
        if len(message) > self._max_line_chars:
            message = f"{message[: self._max_line_chars]}...(line cut: {len(message)} characters)"
            record.msg, record.args = message, None
        if record.exc_info or record.exc_text:
            self._limit_traceback(record)
        return True

    def _limit_traceback(self, record: logging.LogRecord) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._window_start >= self._window_s:
                self._window_start, self._written = now, 0
            if self._written < self._tracebacks_per_window:
                self._written += 1
                suppressed, self._suppressed = self._suppressed, 0
                if suppressed:
                    record.msg = f"{record.getMessage()} ({suppressed} earlier traceback(s) not logged)"
                    record.args = None
                return
            self._suppressed += 1
        exc_info = record.exc_info
        first_line = next(iter(str(exc_info[1]).splitlines()), "") if exc_info else ""
        summary = f"{exc_info[0].__name__}: {first_line}" if exc_info and exc_info[0] else "an exception"
        if len(summary) > self._max_line_chars:
            summary = f"{summary[: self._max_line_chars]}...({len(summary)} characters)"
        record.msg = (
            f"{record.getMessage()}: {summary} (traceback not logged: more than "
            f"{self._tracebacks_per_window} in {self._window_s:.0f} s)"
        )
        record.args, record.exc_info, record.exc_text = None, None, None
