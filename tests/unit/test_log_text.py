"""What a client sent enters a log line clipped, and a log line and its tracebacks stay bounded
whatever the message: the log of a shared server must not grow at a client's will."""

from __future__ import annotations

import logging

import pytest

from udfserve.log_text import CLIENT_TEXT_CHARS, clip, error_line
from udfserve.services.log_limits import LogLimits


def test_short_text_is_kept_as_it_is() -> None:
    assert clip("request-17") == "request-17"


def test_long_text_keeps_its_start_and_says_how_long_it_was() -> None:
    clipped = clip("x" * 4_194_304)
    assert clipped == "x" * CLIENT_TEXT_CHARS + "...(4194304 characters)"


def test_control_characters_cannot_forge_a_log_line() -> None:
    clipped = clip("id\n2026-01-01 ERROR forged line")
    assert "\n" not in clipped and "\\n" in clipped


def test_text_escaped_longer_than_the_limit_is_still_clipped() -> None:
    assert clip("\x00" * 10, 20) == "\\x00" * 5 + "...(10 characters)"


def record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("test", logging.ERROR, __file__, 1, message, args, exc_info)


def failure() -> BaseException:
    try:
        raise ValueError("first line\nsecond line")
    except ValueError as exc:
        return exc


def test_an_overlong_line_is_cut_saying_how_long_it_was() -> None:
    limits = LogLimits(max_line_chars=100)
    line = record("request %s failed", "y" * 10_000)
    assert limits.filter(line)
    assert len(line.getMessage()) < 200 and "10015 characters" in line.getMessage()


def test_the_first_tracebacks_of_a_window_are_logged_whole() -> None:
    limits = LogLimits(tracebacks_per_window=2)
    lines = [record("failed", exc=failure()) for _ in range(2)]
    for line in lines:
        assert limits.filter(line)
    assert all(line.exc_info is not None for line in lines)


def test_tracebacks_beyond_the_window_limit_become_one_line_naming_the_error() -> None:
    limits = LogLimits(tracebacks_per_window=2)
    lines = [record("failed", exc=failure()) for _ in range(5)]
    for line in lines:
        assert limits.filter(line)
    suppressed = lines[2:]
    assert all(line.exc_info is None and line.exc_text is None for line in suppressed)
    message = suppressed[0].getMessage()
    assert "ValueError: first line" in message and "second line" not in message
    assert "traceback not logged" in message


def test_the_next_window_says_how_many_tracebacks_were_left_out() -> None:
    limits = LogLimits(tracebacks_per_window=1, window_s=0.0)
    limits.filter(record("failed", exc=failure()))
    limits._written = 1  # the window is full
    limits._window_s = 3600.0
    limits.filter(record("failed", exc=failure()))
    limits._window_s = 0.0  # the next record opens a new window
    next_line = record("failed", exc=failure())
    limits.filter(next_line)
    assert next_line.exc_info is not None and "1 earlier traceback(s) not logged" in next_line.getMessage()


@pytest.mark.parametrize("count", [1_000])
def test_a_flood_of_failures_adds_at_most_the_window_limit_of_tracebacks(
    count: int, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("flood")
    limits = LogLimits(tracebacks_per_window=10)
    caplog.handler.addFilter(limits)
    with caplog.at_level(logging.ERROR, logger="flood"):
        for _ in range(count):
            try:
                raise RuntimeError("backend broke")
            except RuntimeError:
                logger.exception("request failed")
    assert sum(1 for r in caplog.records if r.exc_info is not None) == 10
    assert len(caplog.records) == count


def test_a_client_is_told_the_first_line_of_an_unexpected_error_not_its_trace() -> None:
    error = RuntimeError('Graph execution error:\n  File "/srv/app/model.py", line 3\nboom')
    assert error_line(error) == "RuntimeError: Graph execution error:"
