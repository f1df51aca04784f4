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
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import pyarrow as pa

from spark_client.config import ClientConfig
from spark_client.credentials import CallMetadata, channel_credentials, uses_tls
from spark_client.errors import AuthenticationFailed, ModelMetadataError, ModelNotFound, RequestRejected
from spark_client.model_spec import ModelSpec, spec_from_tensors
from spark_client.shared_memory import SharedMemoryPayloads
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
        (
            config.tls_root_certificates_file,
            config.tls_client_certificate_file,
            config.tls_client_key_file,
            config.tls_server_name,
        )
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
            options: list[tuple[str, int | str]] = [
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_permit_without_calls", 0),
            ]
            if uses_tls(target, config):
                if config.tls_server_name:
                    options.append(("grpc.ssl_target_name_override", config.tls_server_name))
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


Described = TypeVar("Described")


def connect(
    target: str,
    config: ClientConfig,
    model: str,
    metadata: CallMetadata = (),
    describe: Callable[[grpc.Channel, str, str, int, float, CallMetadata], Described] | None = None,
) -> tuple[grpc.Channel, Described]:
    """A channel to ``target`` whose server has ``model`` ready, and the model as ``describe`` tells it.

    Asking for the model's metadata is the connection check: it fails fast when nothing
    listens, and it proves the server can answer for this model before any batch is sent.
    ``describe`` is the protocol's way of asking (default: the Arrow protocol's
    ``fetch_model_spec``). Raises ``ConnectFailed`` with the reason, ``AuthenticationFailed``
    when the server refuses the client's token or certificate, or ``ModelNotFound`` when it has
    no such model (another server of the node loads the same repository: none is tried).
    """
    ask: Callable[..., Any] = describe or fetch_model_spec
    if target.startswith("unix:"):
        path = Path(target.removeprefix("unix:").removeprefix("//"))
        if not path.exists():
            raise ConnectFailed(f"{target}: socket file {path} does not exist")
    channel = channel_for(target, config)
    try:
        described = ask(channel, target, model, config.model_version, config.connect_timeout_s, metadata)
    except ModelMetadataError as exc:
        forget_channel(target, config)
        if exc.code in {c.name for c in AUTH_ERROR_CODES}:
            raise AuthenticationFailed(
                f"{exc}; set ClientConfig.auth_token or auth_token_file (Spark conf "
                "spark.udfserve.authToken or spark.udfserve.authTokenFile) to the server's token",
                exc.code,
            ) from None
        if exc.code == grpc.StatusCode.NOT_FOUND.name:
            version = f" version {config.model_version}" if config.model_version else ""
            raise ModelNotFound(
                f"model {model!r}{version} does not exist on the server at {target}: {exc.details}"
            ) from None
        raise ConnectFailed(str(exc)) from None
    return channel, described


def fetch_model_spec(
    channel: grpc.Channel,
    target: str,
    model: str,
    version: int,
    timeout_s: float,
    metadata: CallMetadata = (),
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
            exc.details() or "",
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
class Reply:
    """A server's answer to one batch, whatever the protocol: a result, or an error with its code."""

    batch_id: int
    result: pa.RecordBatch | None = None
    code: grpc.StatusCode | None = None
    message: str = ""
    unreadable: str = ""
    """Set when the answer could not be read: the reason (the stream fails, ``bad_answer``)."""
    resend: bool = False
    """The server computed nothing and will serve the same batch sent another way: send it again."""


class StreamBroken(Exception):
    """The call itself ended with a status (the connection reset, the server killed)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


CLIENT_TOO_LARGE_TEXT = "Sent message larger than max"
"""How gRPC words its refusal to send a message over ``grpc.max_send_message_length``."""


class Wire(Protocol):
    """How one protocol carries a partition's batches; ``PredictStream`` does the rest.

    ``open`` starts the call; from then on the wire puts ``Reply``, ``StreamBroken`` or ``END``
    (the server closed a stream normally) into ``events``, from any thread. ``send`` encodes the
    batch when it is sent, so that only the Arrow batch is held while it waits for its answer.
    """

    def open(self, events: queue.Queue[object]) -> None: ...

    def send(self, batch_id: int, batch: pa.RecordBatch) -> None: ...

    def finish(self) -> bool:
        """No more batches: end the call; True when it ended cleanly."""
        ...

    def cancel(self) -> None: ...


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


END = object()


class PredictStream:
    """A partition's batches through one ``Wire`` to one server; use once."""

    def __init__(self, wire: Wire, target: str, model: str, config: ClientConfig) -> None:
        self._wire = wire
        self._target = target
        self._model = model
        self._config = config
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
        self._wire.send(slot.batch_id, slot.held.batch)

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
class ArrowWire:
    """udfserve's own protocol: one bidirectional ``Predict`` stream of Arrow IPC payloads, inline
    or, given ``payloads``, in the node's shared memory (``SharedMemoryPayloads``)."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        model: str,
        config: ClientConfig,
        metadata: CallMetadata = (),
        payloads: SharedMemoryPayloads | None = None,
    ) -> None:
        self._stub = pb_grpc.InferenceStub(channel)
        self._target = target
        self._model = model
        self._version = config.model_version
        self._end_timeout_s = config.connect_timeout_s
        self._metadata = metadata
        self._payloads = payloads
        self._outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
        self._events: queue.Queue[object] | None = None
        self._call: Any = None

    def open(self, events: queue.Queue[object]) -> None:
        self._events = events
        self._call = self._stub.Predict(_drain(self._outbox), metadata=self._metadata)
        threading.Thread(target=self._read_responses, args=(self._call, events), daemon=True).start()

    def send(self, batch_id: int, batch: pa.RecordBatch) -> None:
        request = pb.PredictRequest(model=self._model, version=self._version, batch_id=batch_id)
        regions = self._payloads.place(batch_id, batch) if self._payloads is not None else None
        if regions is None:
            request.arrow_ipc = encode_batch(batch)
        else:
            request.input_region.CopyFrom(regions[0])
            request.output_region.CopyFrom(regions[1])
        self._outbox.put(request)

    def finish(self) -> bool:
        """Half-close, then let the server close the stream."""
        self._outbox.put(None)
        assert self._events is not None
        try:
            event = self._events.get(timeout=self._end_timeout_s)
        except queue.Empty:
            return False
        finally:
            self._close_payloads()
        return event is END

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._outbox.put(None)
        self._close_payloads()

    def _close_payloads(self) -> None:
        if self._payloads is not None:
            self._payloads.close()

    def _read_responses(self, call: Iterator[pb.PredictResponse], events: queue.Queue[object]) -> None:
        """Decode each answer on this thread, so the task's thread only pairs and yields them."""
        try:
            for response in call:
                events.put(self._reply(response))
        except grpc.RpcError as exc:
            events.put(StreamBroken(exc.code(), exc.details() or ""))
        except Exception as exc:  # the task's thread must hear of it, not wait out its deadline
            failure = f"reading the answers failed: {type(exc).__name__}: {exc}"
            events.put(StreamBroken(grpc.StatusCode.UNKNOWN, failure))
        else:
            events.put(END)

    def _reply(self, response: pb.PredictResponse) -> Reply:
        payloads = self._payloads
        # Only a batch this stream put in shared memory can be refused for it: anything else so
        # flagged is an error answer like any other, never a reason to resend without end.
        if response.shared_memory_refused and payloads is not None and payloads.release(response.batch_id):
            if payloads.placing:
                payloads.placing = False
                _refused_shared_memory[self._target] = time.monotonic()
                logger.warning(
                    "%s cannot use this node's shared memory (%s); batches to it travel inline",
                    self._target,
                    response.error.message,
                )
            return Reply(response.batch_id, resend=True)
        if payloads is None:
            return _reply(response)
        if response.output_region_bytes:
            try:
                result = payloads.answer(response.batch_id, response.output_region_bytes)
            except ValueError as exc:  # ArrowPayloadError, or a size the file cannot hold
                return Reply(response.batch_id, unreadable=str(exc))
            return Reply(response.batch_id, result=result)
        payloads.release(response.batch_id)
        reply = _reply(response)
        if reply.result is not None:
            payloads.learn_answer_size(reply.result.num_rows, len(response.arrow_ipc))
        return reply


def _drain(outbox: queue.Queue[pb.PredictRequest | None]) -> Iterator[pb.PredictRequest]:
    """The request side of the call: what the client puts in ``outbox``, until None."""
    while True:
        request = outbox.get()
        if request is None:
            return
        yield request


def _reply(response: pb.PredictResponse) -> Reply:
    if response.HasField("error"):
        code = _CODES_BY_NUMBER.get(response.error.code, grpc.StatusCode.UNKNOWN)
        return Reply(response.batch_id, code=code, message=response.error.message)
    try:
        return Reply(response.batch_id, result=decode_batch(response.arrow_ipc, "PredictResponse.arrow_ipc"))
    except ArrowPayloadError as exc:
        return Reply(response.batch_id, unreadable=str(exc))


def arrow_stream(
    channel: grpc.Channel, target: str, model: str, config: ClientConfig, metadata: CallMetadata = ()
) -> PredictStream:
    """A ``PredictStream`` over udfserve's Arrow protocol, with its payloads in shared memory when
    the server is on this node (a unix socket), the config allows it and the server has not
    refused it lately."""
    payloads = None
    if _may_use_shared_memory(target, config):
        payloads = SharedMemoryPayloads(
            Path(config.shared_memory_dir), config.max_in_flight, config.shared_memory_group_access
        )
    wire = ArrowWire(channel, target, model, config, metadata, payloads)
    return PredictStream(wire, target, model, config)


SHARED_MEMORY_RETRY_S = 300.0
"""After a server refused this process's shared memory, how long its streams go inline before
trying again (the server may be restarted with another --shared-memory-dir)."""
_refused_shared_memory: dict[str, float] = {}


def _may_use_shared_memory(target: str, config: ClientConfig) -> bool:
    if not config.shared_memory or not target.startswith("unix:"):
        return False
    refused_at = _refused_shared_memory.get(target)
    if refused_at is not None and time.monotonic() - refused_at < SHARED_MEMORY_RETRY_S:
        return False
    return Path(config.shared_memory_dir).is_dir()
