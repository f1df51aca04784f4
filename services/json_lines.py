"""One JSON object a line: the log format for log stores (``--log-format json``).

The lines are written by python-json-logger's ``JsonFormatter``, which encodes every value,
escapes newlines and control characters and turns a traceback into one string field. Each object
holds ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message`` and ``process``;
``request_id``, ``model``, ``app_id`` and ``trace_id`` where the line is about a request, a model
or a Spark application (``log_context``); ``traceback`` when an exception is logged; and any
field a call passes with ``extra``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

FIELDS = "{levelname}{name}{message}{process}"
"""The fields of every line after ``time``, as python-json-logger reads a ``{``-style format."""

RENAMED = {"levelname": "level", "name": "logger", "exc_info": "traceback"}

LEFT_OUT = ("color_message",)
"""Record attributes that are not fields: uvicorn's copy of its message with terminal colours."""


class JsonLines(JsonFormatter):
    """One JSON object a line, ``time`` first: a reader sees a line's moment at a glance, and
    ``udfserve.runtime.framework_stderr`` tells the process's own lines from a framework's."""

    def __init__(self) -> None:
        super().__init__(
            FIELDS, style="{", rename_fields=RENAMED, reserved_attrs=[*RESERVED_ATTRS, *LEFT_OUT]
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
            timespec="milliseconds"
        )
        super().add_fields(log_data, record, message_dict)
