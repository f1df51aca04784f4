"""``--log-format json``: one JSON object a line, with the ids of what a line is about, within the
log limits of the text format.

The process-wide part (``configure_logging``: the handler, Python's warnings, exceptions no code
caught) runs in a process of its own, as a server runs it; what it wrote on stderr is read back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from typing import Any

import pytest

from udfserve.services import log_context
from udfserve.services.log_format import TEXT_FORMAT
from udfserve.services.log_limits import MAX_LINE_CHARS, TRACEBACKS_PER_MINUTE

JSON_PROCESS = f"""
import logging, threading, warnings
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext
from udfserve.services import log_context
from udfserve.services.process_setup import configure_logging

configure_logging("INFO", "json")
log = logging.getLogger("udfserve.test")
log.info("plain line")
with log_context.about(request_id="7", model="tabular_mlp", app_id="app-20261128-0001"):
    log.warning("about a request")
log.info("after the request")
with log_context.about(model="tabular_mlp"):
    log.info("passed its own", extra={{"model": "other_model"}})
try:
    raise ValueError("first line\\nsecond line")
except ValueError:
    log.exception("failed\\nacross lines")
log.info("x" * {MAX_LINE_CHARS + 100})
warnings.warn("a deprecated call")
span = NonRecordingSpan(SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=1, is_remote=False))
with trace.use_span(span):
    log.info("inside a span")
thread = threading.Thread(target=lambda: 1 / 0, name="worker")
thread.start()
thread.join()
for index in range({TRACEBACKS_PER_MINUTE + 2}):
    try:
        raise KeyError(index)
    except KeyError:
        log.exception("traceback %d", index)
"""


def stderr_of(script: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stderr


@pytest.fixture(scope="module")
def json_lines() -> list[dict[str, Any]]:
    """Every line the process wrote, each read as one JSON object (a line that is not one fails)."""
    return [json.loads(line) for line in stderr_of(JSON_PROCESS).splitlines()]


def line_of(lines: list[dict[str, Any]], message: str) -> dict[str, Any]:
    [found] = [line for line in lines if line["message"].startswith(message)]
    return found


def test_every_line_holds_time_level_logger_and_message(json_lines: list[dict[str, Any]]) -> None:
    line = line_of(json_lines, "plain line")

    assert list(line)[:4] == ["time", "level", "logger", "message"]
    assert (line["level"], line["logger"]) == ("INFO", "udfserve.test")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["time"]), line["time"]


def test_a_line_about_a_request_carries_its_request_model_and_application_ids(
    json_lines: list[dict[str, Any]],
) -> None:
    line = line_of(json_lines, "about a request")

    assert (line["request_id"], line["model"], line["app_id"]) == ("7", "tabular_mlp", "app-20261128-0001")


def test_a_line_after_the_request_carries_none_of_its_ids(json_lines: list[dict[str, Any]]) -> None:
    line = line_of(json_lines, "after the request")

    assert not {"request_id", "model", "app_id", "trace_id"} & set(line)


def test_an_id_the_call_passes_itself_is_kept(json_lines: list[dict[str, Any]]) -> None:
    assert line_of(json_lines, "passed its own")["model"] == "other_model"


def test_a_traceback_is_one_field_of_one_line(json_lines: list[dict[str, Any]]) -> None:
    line = line_of(json_lines, "failed")

    assert line["message"] == "failed\nacross lines"
    assert line["traceback"].startswith("Traceback (most recent call last):")
    assert line["traceback"].endswith("ValueError: first line\nsecond line")


def test_a_line_over_the_limit_is_cut_as_in_the_text_format(json_lines: list[dict[str, Any]]) -> None:
    line = line_of(json_lines, "xxx")

    assert line["message"] == "x" * MAX_LINE_CHARS + f"...(line cut: {MAX_LINE_CHARS + 100} characters)"


def test_tracebacks_beyond_the_limit_are_left_out_as_in_the_text_format(
    json_lines: list[dict[str, Any]],
) -> None:
    lines = [line for line in json_lines if line["message"].startswith("traceback ")]

    assert sum("traceback" in line for line in json_lines) == TRACEBACKS_PER_MINUTE
    assert "traceback" not in lines[-1]
    assert f"(traceback not logged: more than {TRACEBACKS_PER_MINUTE} in" in lines[-1]["message"]


def test_a_python_warning_is_a_json_line(json_lines: list[dict[str, Any]]) -> None:
    [line] = [line for line in json_lines if line["logger"] == "py.warnings"]

    assert "UserWarning: a deprecated call" in line["message"]


def test_a_line_inside_an_opentelemetry_span_carries_its_trace_id(json_lines: list[dict[str, Any]]) -> None:
    assert line_of(json_lines, "inside a span")["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_an_exception_no_code_caught_is_a_json_line_with_its_traceback(
    json_lines: list[dict[str, Any]],
) -> None:
    line = line_of(json_lines, "uncaught exception in thread worker")

    assert line["level"] == "CRITICAL"
    assert line["traceback"].endswith("ZeroDivisionError: division by zero")


def test_text_stays_the_default_format() -> None:
    text = stderr_of(
        "import logging\n"
        "from udfserve.services.process_setup import configure_logging\n"
        "configure_logging('INFO')\n"
        "logging.getLogger('udfserve.test').info('plain line')\n"
    )

    assert TEXT_FORMAT.startswith("%(asctime)s %(levelname)s")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO \[\d+ udfserve\.test\] plain line\n", text
    ), text


class _Request:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    def log_ids(self) -> dict[str, str]:
        return {"request_id": self.request_id}


def test_requests_answered_together_on_one_event_loop_keep_their_own_ids() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(log_context.LogIds())
    logger = logging.getLogger("udfserve.test.interleaved")
    logger.addHandler(handler)
    logger.propagate = False

    async def answer(request_id: str, turn: asyncio.Event, next_turn: asyncio.Event) -> None:
        bound = log_context.bind(_Request(request_id))
        try:
            logger.warning("admitted %s", request_id)
            next_turn.set()
            await turn.wait()  # the other request runs and logs in between
            logger.warning("answered %s", request_id)
        finally:
            log_context.unbind(bound)

    async def both() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        await asyncio.gather(answer("a", first, second), answer("b", second, first))

    try:
        asyncio.run(both())
    finally:
        logger.removeHandler(handler)

    assert {r.getMessage(): getattr(r, "request_id", None) for r in records} == {
        "admitted a": "a",
        "admitted b": "b",
        "answered a": "a",
        "answered b": "b",
    }
