"""The two formats a udfserve process logs in: lines for people (``text``, the default) and one
JSON object a line for log stores (``json``, written by ``json_lines.JsonLines``).

The bounds of ``log_limits`` apply to both formats alike: they rewrite the record before either
formatter sees it. The JSON formatter's library (python-json-logger, of the ``server`` extra) is
imported only by a process that logs in JSON, so reading the settings needs nothing beyond them.
"""

from __future__ import annotations

import logging
from typing import Literal

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d %(name)s] %(message)s"


def formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of ``log_format``."""
    if log_format == "json":
        from udfserve.services.json_lines import JsonLines

        return JsonLines()
    return logging.Formatter(TEXT_FORMAT)
