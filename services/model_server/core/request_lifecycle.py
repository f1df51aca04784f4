"""The lifecycle of one inference request, the same for every front end of the server.

A front end (the Arrow ``Predict`` stream, KServe's ``ModelInfer`` and ``ModelStreamInfer``, the
native KServe port) decodes requests and encodes answers; what happens in between happens here,
once, so every protocol admits, queues, counts and answers a request the same way::

    request = InferenceRequest(lifecycle, front_end, message, model_name, request_id, job)
    served = request.admit(version)        # the model, ready to serve (or an exception)
    ...                                     # the front end decodes the inputs, checks them
    return request.enqueue(inputs, rows)   # the answer at once, or Pending: finish() makes it
    # any exception before: return request.refuse(exc)

Every request is observed exactly once, with its status (Prometheus, Triton's statistics, its
Spark application). It is counted in flight, which draining waits on, from the moment the
batcher holds it to the moment its answer is made or its client went away.

Where limits on admission belong: a budget over what the whole server accepts goes into
``InferenceRequest.enqueue`` (where the rows and the answer's least size are known) with its
state on ``RequestLifecycle``; the bound per stream on what it holds read and not yet written is
the stream reader's (``frontends.streaming.StreamBounds``), which sees every answer of the stream
whichever front end made it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Generic, TypeVar

import grpc
import numpy as np

from udfserve.log_text import clip
from udfserve.runtime.tensor_conversion import answer_bytes_at_least, check_answer_size
from udfserve.runtime.tensor_spec import TensorSpec, zeros
from udfserve.runtime.value_ranges import check_ranges
from udfserve.services import log_context
from udfserve.services.model_server.core.call_room_waits import CallRoomWaits
from udfserve.services.model_server.core.in_flight import InFlightRequests
from udfserve.services.model_server.core.job_context import JobContext
from udfserve.services.model_server.core.model_table import ModelTable, ServedModel
from udfserve.services.model_server.core.pending import Pending
from udfserve.services.model_server.core.shares import ApplicationShares
from udfserve.services.model_server.errors import ModelUnavailable
from udfserve.services.model_server.observability import tracing as server_tracing
from udfserve.services.model_server.observability.metrics import ModelMetrics, ServerMetrics

if TYPE_CHECKING:
    from udfserve.services.model_server.observability.spans import RequestTrace

M = TypeVar("M")
"""The protocol's request message (what its front end reads when it answers)."""
A = TypeVar("A")
"""The protocol's answer: a response message, or what its front end sends one from."""

ENVELOPE_BYTES = 1024
"""Room kept under the message limit for the response's protobuf envelope around its payload."""


class RequestLifecycle:
    """What every request of one server shares: the models, the metrics, the count of requests in
    flight (both protocols, one count), the largest answer a message can carry, and the scheduling
    of applications."""

    def __init__(
        self,
        models: ModelTable,
        metrics: ServerMetrics,
        in_flight: InFlightRequests,
        max_message_bytes: int,
        shares: ApplicationShares | None = None,
        room_wait_s: float = 0.0,
        room_wait_calls: int = 0,
    ) -> None:
        self.models = models
        self.metrics = metrics
        self.in_flight = in_flight
        self.max_response_bytes = max_message_bytes - ENVELOPE_BYTES
        self.shares = shares or ApplicationShares("fifo", {"default": 1}, "default")
        """Which flow of a model's queue each request waits in (``core.shares``)."""
        self.room_wait_s = room_wait_s
        """How long a request of a front end that reads one request at a time (a stream) waits for
        room in its model's queue before it is refused (``batching.admission``); 0: refused at once."""
        self.call_room_waits = CallRoomWaits(room_wait_calls, metrics.room_waiting_calls)
        """The unary calls waiting for room, at most ``room_wait_calls`` (``core.call_room_waits``)."""


class FrontEnd(ABC, Generic[M, A]):
    """How one protocol answers its requests: one per stream for a streaming protocol (what a
    stream's answers share, such as its shared-memory regions), else one per servicer."""

    @abstractmethod
    def answer(self, request: InferenceRequest[M, A], outputs: dict[str, np.ndarray]) -> A:
        """The answer to ``request`` from its model's outputs (one array per output of
        ``request.outputs``, ``request.rows`` rows). Raises a ``ServingError`` for outputs that
        cannot be answered (``request.check_answer_size``); the request is then refused."""

    @abstractmethod
    def refusal(self, request: InferenceRequest[M, A], exc: Exception) -> tuple[grpc.StatusCode, A]:
        """The status ``exc`` refuses ``request`` with (``errors.failure_status``, or the
        protocol's own words), and the answer that says so."""


class InferenceRequest(Generic[M, A]):
    """One request from the moment it is read until its answer is made.

    Made per request, so it holds slots only; its own ``finish`` makes the answer, so nothing
    else is bound per request."""

    __slots__ = (
        "_lifecycle",
        "front_end",
        "job",
        "message",
        "model_metrics",
        "model_name",
        "outputs",
        "request_id",
        "rows",
        "served",
        "started_s",
        "trace",
    )

    served: ServedModel
    """The model serving the request, once ``admit`` found it ready."""
    outputs: tuple[TensorSpec, ...]
    """The outputs to answer: every output of the model unless the front end chose some."""
    rows: int

    def __init__(
        self,
        lifecycle: RequestLifecycle,
        front_end: FrontEnd[M, A],
        message: M,
        model_name: str,
        request_id: int | str,
        job: JobContext,
    ) -> None:
        self.started_s = time.perf_counter()
        self._lifecycle = lifecycle
        self.front_end = front_end
        self.message = message
        self.model_name = model_name
        self.request_id = request_id
        self.job = job
        self.model_metrics: ModelMetrics | None = lifecycle.models.metrics_of(model_name)
        """The series the request counts in: its model's, also when it is refused because the
        model is loading, failed or serves another version; None for a name of no model here."""
        tracing = server_tracing.ACTIVE
        self.trace: RequestTrace | None = (
            None if tracing is None else tracing.request(job, model_name, request_id)
        )
        """Its spans, when tracing is on and the request is sampled (``observability.tracing``)."""

    def admit(self, version: int) -> ServedModel:
        """The model the request names, ready to serve ``version`` (0: the served one); raises the
        ``ServingError`` that says why not (unknown, loading, failed, draining)."""
        served = self._lifecycle.models.ready(self.model_name, version)
        model = served.model
        assert model is not None and served.batcher is not None and served.metrics is not None
        self.served = served
        self.model_metrics = served.metrics
        self.outputs = model.outputs
        return served

    def enqueue(
        self,
        inputs: dict[str, np.ndarray],
        rows: int,
        room_bytes: int | None = None,
        wait_for_room: bool = False,
        unary_call: bool = False,
    ) -> A | Pending[A]:
        """Queue the checked inputs of ``rows`` rows on the model's batcher: ``Pending`` on the
        batcher's future, whose ``finish`` (this request's) makes the answer. A request of no
        rows is answered at once, and a refused one (its answer cannot fit a message, a full
        queue) with its refusal.

        An answer that cannot fit the message limit whatever the model computes is refused here,
        before any backend call; ``room_bytes`` is the size of a region the answer may be written
        to instead (shared memory), which lifts that check when the answer may fit there. What
        only the model knows (strings, free dimensions) is checked in the front end's answer.

        ``wait_for_room``: the front end reads nothing more until this request is queued (a stream
        does, through ``Pending.hold``), so the request may wait for room in a full queue, up to
        the server's ``room_wait_s``, instead of being refused at once. ``unary_call``: the request
        is a unary call, which holds its handler while it waits: it waits only while a place is
        free in the server's ``call_room_waits``, and is refused at once past them."""
        served = self.served
        try:
            self.rows = rows
            at_least = answer_bytes_at_least(self.outputs, rows)
            if room_bytes is None or room_bytes < at_least:
                check_answer_size(
                    served.name, rows, at_least, self._lifecycle.max_response_bytes, before_running=True
                )
            if rows == 0:
                answer = self.front_end.answer(self, {spec.name: zeros(spec, 0) for spec in self.outputs})
                self._observe("OK", 0)
                return answer
            batcher, model = served.batcher, served.model
            if batcher is None or model is None:  # released while this request was read
                raise ModelUnavailable(
                    f"model '{served.name}' version {served.version} was unloaded before this request "
                    "was queued; retry on a version that serves"
                )
            check_ranges(served.name, model.inputs, inputs)  # before merging: see value_ranges
            share = self._lifecycle.shares.share_of(self.job)
            wait_s = self._lifecycle.room_wait_s if wait_for_room else 0.0
            call_waits = self._lifecycle.call_room_waits if unary_call and wait_s > 0 else None
            if call_waits is not None and not call_waits.take():
                wait_s, call_waits = 0.0, None  # as many calls wait as may: refused at once if full
            if self.trace is not None:
                self.trace.queued(rows)
                share = dataclasses.replace(share, trace=self.trace)
            try:
                future, hold = batcher.enqueue_or_wait(inputs, share, wait_s)
            except BaseException:
                if call_waits is not None:
                    call_waits.release_when(None)
                raise
            if call_waits is not None:
                call_waits.release_when(hold)
            if hold is not None and self.trace is not None:
                self.trace.waiting_for_room(hold)
        except Exception as exc:
            return self.refuse(exc)
        model_metrics = self.model_metrics
        assert model_metrics is not None  # admit set the model's
        self._lifecycle.in_flight.begin()
        model_metrics.in_flight.inc()
        return Pending(future, self.finish, hold)

    def finish(self, outputs: asyncio.Future[dict[str, np.ndarray]]) -> A:
        """The answer once the batcher answered the request; raises ``CancelledError`` when its
        client went away first (the answer is not wanted), having released what it held."""
        model_metrics = self.model_metrics
        assert model_metrics is not None  # enqueue counted it there
        self._lifecycle.in_flight.end()
        model_metrics.in_flight.dec()
        trace = self.trace
        if outputs.cancelled():
            if trace is not None:
                trace.end("CANCELLED")
            raise asyncio.CancelledError
        bound = log_context.bind(self)
        try:
            if trace is not None:
                trace.answering()
            try:
                answer = self.front_end.answer(self, outputs.result())
            except Exception as exc:
                return self.refuse(exc)
            self._observe("OK", self.rows)
            if trace is not None:
                trace.end("OK")
        finally:
            log_context.unbind(bound)
        return answer

    def refuse(self, exc: Exception) -> A:
        """The answer refusing the request for ``exc``, in the front end's words, observed with
        its status. Never raises."""
        bound = log_context.bind(self)
        try:
            code, answer = self.front_end.refusal(self, exc)
            self._observe(code.name, 0)
            if self.trace is not None:
                self.trace.end(code.name)
        finally:
            log_context.unbind(bound)
        return answer

    def log_ids(self) -> dict[str, str]:
        """The ids a log line about this request carries (``log_context``): computed only when
        a line is written while the request is answered or refused; client text clipped."""
        job = self.job
        return {"request_id": clip(self.request_id), "model": clip(self.model_name), "app_id": job.app_id}

    def check_answer_size(self, size_bytes: int) -> None:
        """Refuse (``InvalidInput``) an answer of ``size_bytes`` over the message limit."""
        check_answer_size(self.served.name, self.rows, size_bytes, self._lifecycle.max_response_bytes)

    def _observe(self, code: str, rows: int) -> None:
        seconds = time.perf_counter() - self.started_s
        self._lifecycle.metrics.observe_answer(
            self.model_metrics, self.job, self.request_id, code, seconds, rows
        )
