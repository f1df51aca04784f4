"""W3C trace context (``traceparent``) as both sides read and write it, without OpenTelemetry.

The Spark client sends one ``traceparent`` header in the gRPC metadata of each stream; the
server's spans of that stream's requests become children of the span it names, and are
recorded only when its *sampled* flag is set. The client needs no OpenTelemetry at all for
this: a header is 55 characters of hex, made and read here
(https://www.w3.org/TR/trace-context/#traceparent-header).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TRACEPARENT_KEY = "traceparent"
"""The gRPC metadata key (lower case, as gRPC requires) of the W3C trace context."""

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_SAMPLED = 0x01


@dataclass(frozen=True)
class TraceParent:
    """The span a request belongs under: its trace id, its span id, and whether it is sampled."""

    trace_id: int
    span_id: int
    sampled: bool

    def header(self) -> str:
        """The ``traceparent`` value (version 00)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{_SAMPLED if self.sampled else 0:02x}"

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"


def parse_traceparent(value: str) -> TraceParent | None:
    """The trace context of a ``traceparent`` value; None for anything W3C says to ignore (a
    malformed value, version ff, an all-zero trace or span id)."""
    match = _TRACEPARENT.match(value.strip())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, bool(int(match.group(4), 16) & _SAMPLED))


def new_trace_id() -> int:
    """A random, valid (non-zero) 128-bit trace id, from the OS: Spark's Python workers are forked
    from one daemon, so the ``random`` module's state would be the same in each of them."""
    return int.from_bytes(os.urandom(16), "big") or 1


def new_span_id() -> int:
    """A random, valid (non-zero) 64-bit span id (from the OS, as ``new_trace_id``)."""
    return int.from_bytes(os.urandom(8), "big") or 1


def sampled_with(ratio: float) -> bool:
    """True with probability ``ratio``, drawn from the OS (as ``new_trace_id``)."""
    return int.from_bytes(os.urandom(7), "big") < ratio * (1 << 56)


def new_traceparent(sampled: bool, trace_id: int | None = None) -> TraceParent:
    """A context under a new span id, in trace ``trace_id`` (a new trace when None)."""
    return TraceParent(trace_id or new_trace_id(), new_span_id(), sampled)
