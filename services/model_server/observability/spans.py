"""The spans of a traced request and of the batches it ran in (OpenTelemetry API).

One request (one Spark request batch, or one KServe call)::

    udfserve.request                     child of the client's traceparent, or a root
    ├── udfserve.admission               read to queued: the model found, the payload decoded, checked
    ├── udfserve.room_wait               only when its application's share of the queue was full:
    │                                    waiting for room, until queued or refused (``batching.admission``)
    ├── udfserve.queue_wait              queued to its batch started (linked to the batch)
    └── udfserve.answer                  the outputs encoded into the answer
    udfserve.batch                       child of the first traced request it merged, linked to each
    └── udfserve.device_call             the backend call (its measured duration, ending as it ended)

Spans are made when a phase ends, with the times it began and ended (``start_time``,
``end_time``): the request path keeps integers, not open spans, between its steps, and only
for a request that is traced.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from udfserve.services.model_server.core.job_context import JobContext
from udfserve.tracing import parse_traceparent

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class ServerTracing:
    """The process's tracer, and the decision which requests are traced."""

    def __init__(self, provider: Any, sample_ratio: float) -> None:
        """``provider``: an OpenTelemetry SDK ``TracerProvider`` (shut down by ``shutdown``)."""
        self._provider = provider
        self._tracer = provider.get_tracer("udfserve.model_server")
        self._sample_ratio = sample_ratio

    def request(self, job: JobContext, model: str, request_id: int | str) -> RequestTrace | None:
        """The trace of a request just read, or None when it is not traced: its stream's
        traceparent is not sampled, or, without one, the sampling ratio left it out."""
        parent = parse_traceparent(job.traceparent) if job.traceparent else None
        if parent is None:
            if random.random() >= self._sample_ratio:
                return None
            context = None
        elif not parent.sampled:
            return None
        else:
            remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=_SAMPLED)
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        started_ns = time.time_ns()
        attributes: dict[str, str | int] = {"udfserve.model": model, "udfserve.request_id": str(request_id)}
        for name, value in job.log_fields().items():
            attributes[f"spark.{name}"] = value
        span = self._tracer.start_span(
            "udfserve.request", context, kind=SpanKind.SERVER, attributes=attributes, start_time=started_ns
        )
        return RequestTrace(self._tracer, span, started_ns)

    def batch(self, model: str, traces: Sequence[RequestTrace], rows: int, requests: int) -> BatchTrace:
        """The span of a batch that merged ``traces`` (the traced ones among its ``requests``):
        a child of the first, linked to each, and each request's wait in the queue ends."""
        started_ns = time.time_ns()
        links = [Link(request.span.get_span_context()) for request in traces]
        span = self._tracer.start_span(
            "udfserve.batch",
            trace.set_span_in_context(traces[0].span),
            links=links,
            attributes={
                "udfserve.model": model,
                "udfserve.batch.rows": rows,
                "udfserve.batch.requests": requests,
            },
            start_time=started_ns,
        )
        batch_context = span.get_span_context()
        for request in traces:
            request.batch_started(batch_context, started_ns)
        return BatchTrace(self._tracer, span)

    def shutdown(self) -> None:
        self._provider.shutdown()


class RequestTrace:
    """A traced request's span, and when its current phase began."""

    __slots__ = ("_admitted", "_answer_ns", "_queued_ns", "_started_ns", "_tracer", "span")

    def __init__(self, tracer: trace.Tracer, span: trace.Span, started_ns: int) -> None:
        self._tracer = tracer
        self.span = span
        self._started_ns = started_ns
        self._queued_ns = 0
        self._answer_ns = 0
        self._admitted = False

    def _child(self, name: str, start_ns: int, end_ns: int) -> trace.Span:
        child = self._tracer.start_span(name, trace.set_span_in_context(self.span), start_time=start_ns)
        child.end(end_time=end_ns)
        return child

    def queued(self, rows: int) -> None:
        """The request is in its model's queue: its admission ends."""
        now_ns = time.time_ns()
        self.span.set_attribute("udfserve.rows", rows)
        self._child("udfserve.admission", self._started_ns, now_ns)
        self._queued_ns = now_ns
        self._admitted = True

    def waiting_for_room(self, hold: asyncio.Future[None]) -> None:
        """The request waits for room in its model's queue (``batching.admission``) until ``hold``
        is done: a ``udfserve.room_wait`` span then, and its queue wait starts there."""
        since_ns = self._queued_ns

        def left(_hold: asyncio.Future[None]) -> None:
            now_ns = time.time_ns()
            self._child("udfserve.room_wait", since_ns, now_ns)
            if self._queued_ns:  # no batch took it yet
                self._queued_ns = now_ns

        hold.add_done_callback(left)

    def batch_started(self, batch: SpanContext, now_ns: int) -> None:
        """A batch took (a chunk of) the request: its wait ends at the first, each is linked."""
        self.span.add_link(batch)
        if self._queued_ns:
            self._child("udfserve.queue_wait", self._queued_ns, now_ns)
            self._queued_ns = 0

    def answering(self) -> None:
        self._answer_ns = time.time_ns()

    def end(self, code: str) -> None:
        """The answer is made (``code`` "OK") or the request refused with the status ``code``."""
        now_ns = time.time_ns()
        if not self._admitted:  # refused before it was queued: its admission is all there was
            self._child("udfserve.admission", self._started_ns, now_ns)
        if self._answer_ns:
            self._child("udfserve.answer", self._answer_ns, now_ns)
        span = self.span
        span.set_attribute("rpc.grpc.status", code)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end(end_time=now_ns)


class BatchTrace:
    """A traced batch's span, ended when the batch is answered."""

    __slots__ = ("_tracer", "span")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self.span = span

    def device_call(self, seconds: float, error: BaseException | None) -> None:
        """The backend call just ended after ``seconds`` (measured around the call itself)."""
        end_ns = time.time_ns()
        call = self._tracer.start_span(
            "udfserve.device_call",
            trace.set_span_in_context(self.span),
            start_time=end_ns - int(seconds * 1e9),
        )
        if error is not None:
            call.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        call.end(end_time=end_ns)

    def end(self) -> None:
        self.span.end()
