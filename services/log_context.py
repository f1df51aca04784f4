"""What a log line is about: the request, model, Spark application and trace it belongs to.

A log line written while a request is answered carries that request's ids as fields of its own
in the JSON log format (``--log-format json``), so a log store can gather every line of one
request, one model or one Spark application without parsing messages. The ids are not passed
down as arguments: the code that knows them binds a *subject* in a context variable for as long
as it works on it, and ``LogIds``, a filter on the process's log handler, copies the subject's
ids onto each record made meanwhile. Context variables follow asyncio tasks and
``asyncio.to_thread`` and stay apart between concurrent tasks, so two requests answered on one
event loop never lend each other their ids.

Binding costs one ``ContextVar.set`` and ``reset`` and no formatting: a subject computes its ids
only when a record is made while it is bound (``LogSubject.log_ids``), which on the happy path of
a request is never. The trace id is the active OpenTelemetry span's, in a process that has
imported OpenTelemetry (never imported here), or a subject's own.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Protocol

ID_FIELDS = ("request_id", "model", "app_id", "trace_id")
"""The record attributes (and JSON fields) ``LogIds`` fills where they are known."""


class LogSubject(Protocol):
    """What a piece of work is about; its ids are computed when a record is made, not before."""

    def log_ids(self) -> Mapping[str, str]:
        """Some of ``ID_FIELDS`` with their values (already clipped to a log line's bounds);
        empty values are left out of the record."""
        ...


class _Fields:
    """A subject of fixed ids (``about``): for work that binds once, not once per request."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Mapping[str, str]) -> None:
        self._ids = ids

    def log_ids(self) -> Mapping[str, str]:
        return self._ids


_SUBJECT: ContextVar[LogSubject | None] = ContextVar("udfserve_log_subject", default=None)


def bind(subject: LogSubject) -> Token[LogSubject | None]:
    """Make ``subject`` what records of this context are about, until ``unbind(token)``: the
    fastest form, for the request path (no generator, no allocation)."""
    return _SUBJECT.set(subject)


def unbind(token: Token[LogSubject | None]) -> None:
    _SUBJECT.reset(token)


@contextmanager
def about(**ids: str) -> Iterator[None]:
    """Within the block, records of this context carry ``ids`` (for instance ``model=...``)."""
    token = _SUBJECT.set(_Fields(ids))
    try:
        yield
    finally:
        _SUBJECT.reset(token)


def current_ids() -> dict[str, str]:
    """The ids a record made here would carry: the bound subject's, and the active trace's."""
    subject = _SUBJECT.get()
    ids = {k: v for k, v in subject.log_ids().items() if v} if subject is not None else {}
    if "trace_id" not in ids:
        trace_id = _active_trace_id()
        if trace_id:
            ids["trace_id"] = trace_id
    return ids


def _active_trace_id() -> str | None:
    """The W3C trace id (32 hex digits) of the active OpenTelemetry span, in a process that uses
    OpenTelemetry; None elsewhere, or outside a span."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class LogIds(logging.Filter):
    """Copies ``current_ids()`` onto each record of its handler; an id the call passed itself
    (``extra={"model": ...}``) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_ids().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
