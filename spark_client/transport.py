"""gRPC to a model server: a channel per worker process and target, and one Predict stream per partition.

A ``PredictStream`` keeps up to ``max_in_flight`` batches of a partition held at once: sent
and awaiting an answer, waiting to be resent after RESOURCE_EXHAUSTED, or answered and waiting
for the batches before them. Answers are paired with batches by id and yielded in input order.

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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa

from spark_client.config import ClientConfig
from spark_client.credentials import Metadata, channel_credentials, uses_tls
from spark_client.errors import AuthenticationFailed, ModelMetadataError, RequestRejected
from spark_client.metadata import ModelSpec, spec_from_tensors
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch

logger = logging.getLogger(__name__)

USER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
"""Answers that mean the request is wrong: the task fails with the server's message."""

AUTH_ERROR_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
"""Refusals of the client's credentials: a configuration error, never a reason to fall back."""

_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

ChannelKey = tuple[str, int, tuple[str | None, ...]]
_channels: dict[ChannelKey, grpc.Channel] = {}
_channels_lock = threading.Lock()


class ConnectFailed(ConnectionError):
    """No connection to the target within the connect timeout."""


@dataclass
class HeldBatch:
    """A batch of the partition and, once the server answered it, the answer."""

    batch: pa.RecordBatch
    result: pa.RecordBatch | None = None


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


def _channel_key(target: str, config: ClientConfig) -> ChannelKey:
    tls = (
        (config.tls_root_certificates_file, config.tls_client_certificate_file, config.tls_client_key_file)
        if uses_tls(target, config)
        else ()
    )
    return (target, config.max_message_bytes, tls)


def channel_for(target: str, config: ClientConfig) -> grpc.Channel:
    """The worker process's channel to ``target``, created once and reused by every later task.

    TCP targets get TLS when the config names any TLS file; unix sockets stay plaintext.
    """
    key = _channel_key(target, config)
    with _channels_lock:
        channel = _channels.get(key)
        if channel is None:
            options = [
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_permit_without_calls", 0),
            ]
            if uses_tls(target, config):
                channel = grpc.secure_channel(target, channel_credentials(config), options=options)
            else:
                channel = grpc.insecure_channel(target, options=options)
            _channels[key] = channel
        return channel


def forget_channel(target: str, config: ClientConfig) -> None:
    """Drop a failed channel so the next task dials afresh instead of waiting out gRPC's back-off."""
    with _channels_lock:
        channel = _channels.pop(_channel_key(target, config), None)
    if channel is not None:
        channel.close()


def connect(
    target: str, config: ClientConfig, model: str, metadata: Metadata = ()
) -> tuple[grpc.Channel, ModelSpec]:
    """A channel to ``target`` whose server has ``model`` ready, and the model's spec.

    Asking for the model's metadata is the connection check: it fails fast when nothing
    listens, and it proves the server can answer for this model before any batch is sent.
    Raises ``ConnectFailed`` with the reason, or ``AuthenticationFailed`` when the server
    refuses the client's token or certificate.
    """
    if target.startswith("unix:"):
        path = Path(target.removeprefix("unix:").removeprefix("//"))
        if not path.exists():
            raise ConnectFailed(f"{target}: socket file {path} does not exist")
    channel = channel_for(target, config)
    try:
        spec = fetch_model_spec(
            channel, target, model, config.model_version, config.connect_timeout_s, metadata
        )
    except ModelMetadataError as exc:
        forget_channel(target, config)
        if exc.code in {c.name for c in AUTH_ERROR_CODES}:
            raise AuthenticationFailed(
                f"{exc}; set ClientConfig.auth_token or auth_token_file (Spark conf "
                "spark.udfserve.authToken or spark.udfserve.authTokenFile) to the server's token",
                exc.code,
            ) from None
        raise ConnectFailed(str(exc)) from None
    return channel, spec


def fetch_model_spec(
    channel: grpc.Channel, target: str, model: str, version: int, timeout_s: float, metadata: Metadata = ()
) -> ModelSpec:
    """The model's inputs and outputs as the server describes them (``GetModelMetadata``)."""
    stub = pb_grpc.InferenceStub(channel)
    try:
        meta = stub.GetModelMetadata(
            pb.ModelMetadataRequest(model=model, version=version), timeout=timeout_s, metadata=metadata
        )
    except grpc.RpcError as exc:
        raise ModelMetadataError(
            f"server {target} could not describe model {model!r} (version {version or 'default'}): "
            f"{exc.code().name}: {exc.details()}",
            exc.code().name,
        ) from None
    if meta.state != pb.MODEL_STATE_READY:
        state = pb.ModelState.Name(meta.state)
        raise ModelMetadataError(
            f"server {target}: model {model!r} is {state}, expected MODEL_STATE_READY"
            + (f": {meta.error}" if meta.error else "")
        )
    return spec_from_tensors(
        meta.name,
        meta.version,
        [(t.name, t.dtype, t.shape) for t in meta.inputs],
        [(t.name, t.dtype, t.shape) for t in meta.outputs],
    )


@dataclass
class _Slot:
    held: HeldBatch
    payload: bytes = b""
    batch_id: int | None = None
    sent_at_s: float = 0.0
    retry_since_s: float | None = None
    backoff_s: float = 0.0


@dataclass
class StreamCounters:
    """What one stream did, for the partition's statistics."""

    sent: int = 0
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


_END = object()


class PredictStream:
    """One bidirectional Predict call carrying a partition's batches; use once."""

    def __init__(
        self, channel: grpc.Channel, target: str, model: str, config: ClientConfig, metadata: Metadata = ()
    ) -> None:
        self._stub = pb_grpc.InferenceStub(channel)
        self._target = target
        self._model = model
        self._config = config
        self._metadata = metadata
        self._ids = itertools.count(1)
        self._closing: _Closing | None = None
        self.counters = StreamCounters()

    def run(self, items: Iterator[HeldBatch]) -> Iterator[pa.RecordBatch]:
        """One answer per item, in order; raises ``StreamFailed`` or ``RequestRejected``.

        Items that already carry an answer (handed back by a stream that failed) are not sent,
        only yielded in their turn. ``items`` is read lazily, at most ``max_in_flight`` ahead of
        what has been yielded; after ``StreamFailed`` the caller goes on reading it where the
        stream stopped.
        """
        outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
        events: queue.Queue[object] = queue.Queue()
        call = self._stub.Predict(_drain(outbox), metadata=self._metadata)
        reader = threading.Thread(target=_read_responses, args=(call, events), daemon=True)
        reader.start()
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
                        slots[next_seq].payload = encode_batch(item.batch)
                        self._send(outbox, slots[next_seq], next_seq, in_flight)
                    next_seq += 1
                if head in slots and slots[head].held.result is not None:
                    result = slots.pop(head).held.result
                    head += 1
                    assert result is not None
                    yield result
                    continue
                if exhausted and not slots:
                    break
                if self._closing is not None and not in_flight:
                    raise self._failed(self._closing.reason, self._closing.kind, slots, head)
                now = time.monotonic()
                while self._closing is None and resends and resends[0][0] <= now:
                    _, seq = heapq.heappop(resends)
                    self.counters.resent += 1
                    self._send(outbox, slots[seq], seq, in_flight)
                event = self._next_event(events, slots, in_flight, resends, head)
                if event is None:
                    continue
                self._handle(event, slots, in_flight, resends, head)
            outbox.put(None)
            finished = self._wait_for_end(events)
        finally:
            if not finished:
                call.cancel()
                outbox.put(None)

    # -- sending and receiving -------------------------------------------------------------
    def _send(
        self, outbox: queue.Queue[pb.PredictRequest | None], slot: _Slot, seq: int, in_flight: dict[int, int]
    ) -> None:
        slot.batch_id = next(self._ids)
        slot.sent_at_s = time.monotonic()
        in_flight[slot.batch_id] = seq
        self.counters.sent += 1
        outbox.put(
            pb.PredictRequest(
                model=self._model,
                version=self._config.model_version,
                batch_id=slot.batch_id,
                arrow_ipc=slot.payload,
            )
        )

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
        if event is _END:
            raise self._failed(
                f"{self._target} closed the stream with batches unanswered", "stream_closed", slots, head
            )
        if isinstance(event, grpc.RpcError):
            code = event.code()
            if code in AUTH_ERROR_CODES:
                raise AuthenticationFailed(
                    f"server {self._target} refused the Predict call for model {self._model!r} with "
                    f"{code.name}: {event.details()}; set ClientConfig.auth_token or auth_token_file",
                    code.name,
                )
            raise self._failed(
                f"{self._target} broke the stream: {code.name}: {event.details()}",
                f"stream_error:{code.name}",
                slots,
                head,
            )
        assert isinstance(event, pb.PredictResponse)
        seq = in_flight.pop(event.batch_id, None)
        if seq is None:
            logger.warning("ignoring an answer from %s to unknown batch id %d", self._target, event.batch_id)
            return
        slot = slots[seq]
        slot.batch_id = None
        if event.HasField("error"):
            self._handle_error(event.error, slot, seq, slots, resends, head)
            return
        rows = slot.held.batch.num_rows
        try:
            result = decode_batch(event.arrow_ipc, "PredictResponse.arrow_ipc")
        except ArrowPayloadError as exc:
            raise self._failed(
                f"{self._target} sent an unreadable answer: {exc}", "bad_answer", slots, head
            ) from None
        if result.num_rows != rows:
            raise self._failed(
                f"{self._target} answered {result.num_rows} rows to a batch of {rows} rows",
                "bad_answer",
                slots,
                head,
            )
        slot.held.result = result
        self.counters.answered += 1
        self.counters.rows += rows

    def _handle_error(
        self,
        error: pb.Error,
        slot: _Slot,
        seq: int,
        slots: dict[int, _Slot],
        resends: list[tuple[float, int]],
        head: int,
    ) -> None:
        code = _CODES_BY_NUMBER.get(error.code, grpc.StatusCode.UNKNOWN)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            now = time.monotonic()
            if slot.retry_since_s is None:
                slot.retry_since_s, slot.backoff_s = now, self._config.initial_backoff_s
            elif now - slot.retry_since_s > self._config.max_retry_time_s:
                raise self._failed(
                    f"{self._target} kept answering RESOURCE_EXHAUSTED for "
                    f"{now - slot.retry_since_s:.1f} s (max_retry_time_s={self._config.max_retry_time_s:g}): "
                    f"{error.message}",
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
                f"{error.message}",
                code.name,
            )
        if code in USER_ERROR_CODES:
            raise RequestRejected(
                f"server {self._target} refused a batch of {slot.held.batch.num_rows} rows for model "
                f"{self._model!r} with {code.name}: {error.message}",
                code.name,
            )
        if self._closing is None:
            # Draining (UNAVAILABLE) or broken (INTERNAL): what the server accepted before is still
            # answered, so collect it instead of computing it a second time elsewhere.
            self._closing = _Closing(
                f"{self._target} answered a batch with {code.name}: {error.message}",
                f"server_error:{code.name}",
            )

    def _failed(self, reason: str, kind: str, slots: dict[int, _Slot], head: int) -> StreamFailed:
        held = [slots[seq].held for seq in sorted(slots)]
        assert not slots or min(slots) == head
        return StreamFailed(reason, kind, held)

    def _wait_for_end(self, events: queue.Queue[object]) -> bool:
        """After the last answer, let the server close the stream; True if it did."""
        try:
            event = events.get(timeout=self._config.connect_timeout_s)
        except queue.Empty:
            return False
        return event is _END


def _drain(outbox: queue.Queue[pb.PredictRequest | None]) -> Iterator[pb.PredictRequest]:
    """The request side of the call: what the client puts in ``outbox``, until None."""
    while True:
        request = outbox.get()
        if request is None:
            return
        yield request


def _read_responses(call: Iterator[pb.PredictResponse], events: queue.Queue[object]) -> None:
    try:
        for response in call:
            events.put(response)
    except grpc.RpcError as exc:
        events.put(exc)
    else:
        events.put(_END)
