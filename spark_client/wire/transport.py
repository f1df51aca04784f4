"""gRPC to a model server: a channel per worker process and target, and one stream per partition.

A ``PredictStream`` keeps up to ``max_in_flight`` batches of a partition held at once: sent
and awaiting an answer, waiting to be resent after RESOURCE_EXHAUSTED, or answered and waiting
for the batches before them. Answers are paired with batches by id and yielded in input order.
How the batches travel is the ``Wire``'s business: ``ArrowWire`` here (udfserve's bidirectional
``Predict`` stream of Arrow IPC payloads), ``KServeWire`` in ``kserve_transport.py``. A batch is
encoded when it is sent, and again if it is resent, so only the Arrow batch is held meanwhile.

When the server answers a batch UNAVAILABLE or INTERNAL (it is draining, or broken) the stream
stops sending but still waits for the batches the server already accepted, which a draining
server answers. When the stream ends with a status (connection reset, server killed) or the
oldest batch gets no answer within ``request_timeout_s``, it is cancelled at once. Either way
``StreamFailed`` hands the held batches back in order, each with its answer if it already had
one, so the caller computes only the unanswered ones elsewhere: no row is lost or answered twice.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pyarrow as pa

from udfserve.spark_client.common.errors import AuthenticationFailed, ModelNotFound, RequestRejected
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.wire import (
    AUTH_ERROR_CODES,
    CLIENT_TOO_LARGE_TEXT,
    END,
    USER_ERROR_CODES,
    Reply,
    StreamBroken,
    Wire,
)

logger = logging.getLogger(__name__)


@dataclass
class HeldBatch:
    """A batch of the partition and, once the server answered it, the answer and the model version
    that computed it."""

    batch: pa.RecordBatch
    result: pa.RecordBatch | None = None
    version: int = 0


PINNED_VERSION_GONE = "pinned_version_gone"
"""The kind of ``StreamFailed`` of a job whose pinned version a server no longer keeps, when the
job asked to follow the version serving instead (``when_pinned_version_gone="follow"``)."""


class StreamFailed(Exception):
    """The server failed mid-stream; ``held`` are the batches not yet yielded, in input order.

    ``kind`` is a short, bounded label of the cause (``deadline_exceeded``,
    ``server_error:UNAVAILABLE``, ``stream_error:CANCELLED``...) for the client's counters.
    """

    def __init__(self, reason: str, kind: str, held: list[HeldBatch]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.held = held


@dataclass
class _Slot:
    held: HeldBatch
    batch_id: int | None = None
    sent_at_s: float = 0.0
    retry_since_s: float | None = None
    backoff_s: float = 0.0


@dataclass
class StreamCounters:
    """What one stream did, for the partition's statistics."""

    sent: int = 0
    """Sends, first sends and resends alike."""
    sent_in_shared_memory: int = 0
    """Of them, sends whose payload went through the node's shared memory (the rest inline)."""
    resent: int = 0
    backoff_waits: int = 0
    backoff_s: float = 0.0
    answered: int = 0
    rows: int = 0


@dataclass
class _Closing:
    """The server refused a batch as unable to serve: send nothing more, collect what it accepted."""

    reason: str
    kind: str


class PredictStream:
    """A partition's batches through one ``Wire`` to one server; use once."""

    def __init__(self, wire: Wire, target: str, model: str, config: TaskConfig) -> None:
        self._wire = wire
        self._target = target
        self._model = model
        self._config = config
        self._ids = itertools.count(1)
        self._closing: _Closing | None = None
        self.counters = StreamCounters()

    def run(self, items: Iterator[HeldBatch]) -> Iterator[HeldBatch]:
        """Each item answered (``result`` and ``version`` set), in order; raises ``StreamFailed``
        or ``RequestRejected``.

        Items that already carry an answer (handed back by a stream that failed) are not sent,
        only yielded in their turn. ``items`` is read lazily, at most ``max_in_flight`` ahead of
        what has been yielded; after ``StreamFailed`` the caller goes on reading it where the
        stream stopped.
        """
        events: queue.Queue[object] = queue.Queue()
        self._wire.open(events)
        slots: dict[int, _Slot] = {}  # by sequence number
        in_flight: dict[int, int] = {}  # batch id -> sequence number
        resends: list[tuple[float, int]] = []
        next_seq = head = 0
        exhausted = False
        finished = False
        try:
            while True:
                while self._closing is None and not exhausted and len(slots) < self._config.max_in_flight:
                    item = next(items, None)
                    if item is None:
                        exhausted = True
                        break
                    slots[next_seq] = _Slot(item)
                    if item.result is None:
                        self._send(slots[next_seq], next_seq, in_flight)
                    next_seq += 1
                if head in slots and slots[head].held.result is not None:
                    answered = slots.pop(head).held
                    head += 1
                    yield answered
                    continue
                if exhausted and not slots:
                    break
                if self._closing is not None and not in_flight:
                    raise self._failed(self._closing.reason, self._closing.kind, slots, head)
                now = time.monotonic()
                while self._closing is None and resends and resends[0][0] <= now:
                    _, seq = heapq.heappop(resends)
                    self.counters.resent += 1
                    self._send(slots[seq], seq, in_flight)
                event = self._next_event(events, slots, in_flight, resends, head)
                if event is None:
                    continue
                self._handle(event, slots, in_flight, resends, head)
            finished = self._wire.finish()
        finally:
            if not finished:
                self._wire.cancel()

    # -- sending and receiving -------------------------------------------------------------
    def _send(self, slot: _Slot, seq: int, in_flight: dict[int, int]) -> None:
        slot.batch_id = next(self._ids)
        slot.sent_at_s = time.monotonic()
        in_flight[slot.batch_id] = seq
        self.counters.sent += 1
        if self._wire.send(slot.batch_id, slot.held.batch):
            self.counters.sent_in_shared_memory += 1

    def _next_event(
        self,
        events: queue.Queue[object],
        slots: dict[int, _Slot],
        in_flight: dict[int, int],
        resends: list[tuple[float, int]],
        head: int,
    ) -> object | None:
        """The next answer, or None when a resend falls due; fails the stream past a batch's deadline."""
        now = time.monotonic()
        wake_at = resends[0][0] if resends and self._closing is None else float("inf")
        if in_flight:
            oldest = min(slots[seq].sent_at_s for seq in in_flight.values())
            deadline = oldest + self._config.request_timeout_s
            if deadline <= now:
                raise self._failed(
                    f"no answer from {self._target} within "
                    f"request_timeout_s={self._config.request_timeout_s:g} s",
                    "deadline_exceeded",
                    slots,
                    head,
                )
            wake_at = min(wake_at, deadline)
        try:
            if wake_at == float("inf"):
                return events.get()
            return events.get(timeout=max(wake_at - now, 0.0))
        except queue.Empty:
            return None

    def _handle(
        self,
        event: object,
        slots: dict[int, _Slot],
        in_flight: dict[int, int],
        resends: list[tuple[float, int]],
        head: int,
    ) -> None:
        if event is END:
            raise self._failed(
                f"{self._target} closed the stream with batches unanswered", "stream_closed", slots, head
            )
        if isinstance(event, StreamBroken):
            first = slots.get(head)
            self._refuse_if_too_large(event.code, event.details, first.held.batch.num_rows if first else None)
            if event.code in AUTH_ERROR_CODES:
                raise AuthenticationFailed(
                    f"server {self._target} refused the call for model {self._model!r} with "
                    f"{event.code.name}: {event.details}; set ClientConfig.auth_token or auth_token_file",
                    event.code.name,
                )
            raise self._failed(
                f"{self._target} broke the stream: {event.code.name}: {event.details}",
                f"stream_error:{event.code.name}",
                slots,
                head,
            )
        assert isinstance(event, Reply)
        seq = in_flight.pop(event.batch_id, None)
        if seq is None:
            logger.warning("ignoring an answer from %s to unknown batch id %d", self._target, event.batch_id)
            return
        slot = slots[seq]
        slot.batch_id = None
        if event.resend:
            heapq.heappush(resends, (time.monotonic(), seq))
            return
        if event.code is not None:
            self._handle_error(event.code, event.message, slot, seq, slots, resends, head)
            return
        if event.unreadable:
            raise self._failed(
                f"{self._target} sent an unreadable answer: {event.unreadable}", "bad_answer", slots, head
            )
        result = event.result
        assert result is not None
        rows = slot.held.batch.num_rows
        if result.num_rows != rows:
            raise self._failed(
                f"{self._target} answered {result.num_rows} rows to a batch of {rows} rows",
                "bad_answer",
                slots,
                head,
            )
        slot.held.result = result
        slot.held.version = event.version
        self.counters.answered += 1
        self.counters.rows += rows

    def _refuse_if_too_large(self, code: grpc.StatusCode, details: str, rows: int | None) -> None:
        """gRPC's own refusal to send a message over the limit is RESOURCE_EXHAUSTED too, which
        would read as a busy or failed server where the batch is at fault. The rechunker cuts
        requests to half the limit, so only a row this large alone gets here."""
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and CLIENT_TOO_LARGE_TEXT in details:
            which = f" (the first unanswered holds {rows} rows)" if rows is not None else ""
            raise RequestRejected(
                f"a request for model {self._model!r}{which} was too large to send: {details}; "
                "expected rows that fit one message of max_message_bytes "
                f"({self._config.max_message_bytes:,}): raise ClientConfig.max_message_bytes and the "
                "servers' --max-message-bytes together, or send through the node's unix socket, whose "
                "payloads go in shared memory",
                code.name,
            )

    def _handle_error(
        self,
        code: grpc.StatusCode,
        message: str,
        slot: _Slot,
        seq: int,
        slots: dict[int, _Slot],
        resends: list[tuple[float, int]],
        head: int,
    ) -> None:
        self._refuse_if_too_large(code, message, slot.held.batch.num_rows)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            now = time.monotonic()
            if slot.retry_since_s is None:
                slot.retry_since_s, slot.backoff_s = now, self._config.initial_backoff_s
            elif now - slot.retry_since_s > self._config.max_retry_time_s:
                raise self._failed(
                    f"{self._target} kept answering RESOURCE_EXHAUSTED for "
                    f"{now - slot.retry_since_s:.1f} s (max_retry_time_s={self._config.max_retry_time_s:g}): "
                    f"{message}",
                    "retry_time_exceeded",
                    slots,
                    head,
                )
            else:
                slot.backoff_s = min(slot.backoff_s * 2, self._config.max_backoff_s)
            self.counters.backoff_waits += 1
            self.counters.backoff_s += slot.backoff_s
            heapq.heappush(resends, (now + slot.backoff_s, seq))
            return
        if code in AUTH_ERROR_CODES:
            raise AuthenticationFailed(
                f"server {self._target} refused a batch for model {self._model!r} with {code.name}: "
                f"{message}",
                code.name,
            )
        if (
            code is grpc.StatusCode.NOT_FOUND
            and self._config.model_version
            and self._config.when_pinned_version_gone == "follow"
        ):
            # the job's version is gone from this server: the partition follows the one serving
            raise self._failed(f"{self._target}: {message}", PINNED_VERSION_GONE, slots, head)
        if code in USER_ERROR_CODES:
            refusal = ModelNotFound if code is grpc.StatusCode.NOT_FOUND else RequestRejected
            raise refusal(
                f"server {self._target} refused a batch of {slot.held.batch.num_rows} rows for model "
                f"{self._model!r} with {code.name}: {message}",
                code.name,
            )
        if self._closing is None:
            # Draining (UNAVAILABLE) or broken (INTERNAL): what the server accepted before is still
            # answered, so collect it instead of computing it a second time elsewhere.
            self._closing = _Closing(
                f"{self._target} answered a batch with {code.name}: {message}", f"server_error:{code.name}"
            )

    def _failed(self, reason: str, kind: str, slots: dict[int, _Slot], head: int) -> StreamFailed:
        held = [slots[seq].held for seq in sorted(slots)]
        assert not slots or min(slots) == head
        return StreamFailed(reason, kind, held)


# -- the Arrow protocol ------------------------------------------------------------------------
