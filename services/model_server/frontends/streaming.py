"""Many requests on one gRPC stream, answered concurrently and in completion order.

Both protocols of the server (the Arrow ``Predict`` stream and KServe's ``ModelStreamInfer``)
answer the requests of one stream this way, so a client with several batches in flight has
them batched together with everyone else's.

One task reads the stream. What a request needs before it waits (decoding, checking,
queueing in the batcher) runs inline in that task, and what it waits for is one future whose
completion callback makes the answer (``answer_inline``, ``Pending``): no task, semaphore or
queue per request, which on a busy stream cost as much as the request's own work.

What a stream holds is bounded (``StreamBounds``): a request counts from the moment it is read
until its answer has been written to the transport, whether it waits for the batcher, was
answered at once (a refusal, an empty batch) or waits for the client to take its answer. At the
bound the stream is not read any more: a client that never reads its answers stops being read
itself (HTTP/2 flow control then holds its requests on its side), instead of the server keeping
an answer for every request it sends. The stream is not read either while its last request
waits for room in its model's queue (``Pending.hold``, ``batching.admission``): that request is
queued once the queue has room, and the client's next ones stay on its side meanwhile instead of
being read only to be refused. A request counts with the bytes gRPC read for it: the
inference streams are served with their requests as those bytes (``RawStreamRequests``) and
parse them in their reader (``parse_request``), since measuring a parsed protobuf message
encodes it again.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.core.pending import Pending

T = TypeVar("T")
R = TypeVar("R")
M = TypeVar("M", bound=Message)

STREAM_METHODS = frozenset(
    {"/udfserve.v1.Inference/Predict", "/inference.GRPCInferenceService/ModelStreamInfer"}
)
"""The inference streams, whose requests their reader takes as the bytes gRPC read."""


@dataclass(frozen=True)
class StreamBounds:
    """What one stream may hold at once: requests read whose answers are not yet written to the
    transport, by count and by the bytes of their messages. (An answer is bounded by the message
    limit, and held only while its request counts.) A request is always read when the stream
    holds nothing, so one message up to the server's message limit passes whatever ``max_bytes``
    says."""

    max_requests: int = 64
    max_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_bytes < 1:
            raise ValueError(
                f"a stream must be allowed at least 1 request and 1 byte, received "
                f"max_requests={self.max_requests} max_bytes={self.max_bytes}"
            )


DEFAULT_STREAM_BOUNDS = StreamBounds()


class PausedStreams(Protocol):
    """Counts the streams not read because their answers wait to be written (a gauge)."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


class UnparseableRequest(InvalidInput):
    """A stream's message is not the protocol's request: the stream ends INVALID_ARGUMENT."""


def parse_request(message_type: type[M], raw: bytes) -> M:
    """``raw`` as a ``message_type``; ``UnparseableRequest`` naming the type when it is not one."""
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        raise UnparseableRequest(
            f"a message of {len(raw)} bytes on the stream cannot be parsed as "
            f"{message_type.DESCRIPTOR.full_name} ({exc}); expected a serialized message of that type"
        ) from None


async def parsed_requests(
    raw_requests: AsyncIterator[bytes], message_type: type[M], unreadable: list[UnparseableRequest]
) -> AsyncIterator[tuple[M, int]]:
    """The stream's requests parsed, each with its size as read (what the stream's bounds count).

    At the first message that does not parse the requests end and its refusal goes to
    ``unreadable``: the requests before it are still answered, and then the stream ends with it.
    """
    async for raw in raw_requests:
        try:
            request = parse_request(message_type, raw)
        except UnparseableRequest as exc:
            unreadable.append(exc)
            return
        yield request, len(raw)


def size_as_read(item: tuple[object, int]) -> int:
    """The size that ``parsed_requests`` read a request in, for ``answer_inline``'s ``size_of``."""
    return item[1]


class RawStreamRequests(grpc.aio.ServerInterceptor):
    """Serves the inference streams (``STREAM_METHODS``) with their requests as the bytes gRPC
    read, not parsed: a stream counts what it holds in those bytes, and parses them itself."""

    def __init__(self, methods: frozenset[str] = STREAM_METHODS) -> None:
        self._methods = methods

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler.stream_stream is None
            or handler_call_details.method not in self._methods
        ):
            return handler
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, response_serializer=handler.response_serializer
        )


async def answer_inline(
    requests: AsyncIterator[T],
    start: Callable[[T], R | Pending[R]],
    bounds: StreamBounds,
    size_of: Callable[[T], int] = lambda _request: 0,
    paused: PausedStreams | None = None,
) -> AsyncIterator[R]:
    """Answers of ``requests`` in completion order; the stream is read only while it holds less
    than ``bounds`` (requests, and their bytes by ``size_of``: none unless given, until their
    answers are written).

    ``start(request)`` runs in the task that reads the stream and returns the answer, or a
    ``Pending`` one. It should not raise: an exception from it, from ``finish`` or from the
    stream itself (the client went away, an oversized message) ends the stream with that
    exception once the answers ready before it are out. An answer counts as written when the
    consumer asks for the next one (gRPC's handler asks once its write completed), so a client
    that does not read its answers keeps the stream at its bound, and HTTP/2 flow control pushes
    back on it. ``paused`` counts the stream while it waits at its bound. When the consumer stops,
    pending futures are cancelled.
    """
    answers: _Answers[T, R] = _Answers(asyncio.get_running_loop(), bounds, size_of, paused)
    reader = asyncio.create_task(answers.read(requests, start))
    try:
        while True:
            if answers.ready:
                answer, charge = answers.ready.popleft()
                yield answer
                answers.written(charge)
            elif answers.failure is not None:
                raise answers.failure
            elif answers.ended:
                return
            else:
                await answers.wait()
    finally:
        answers.close()
        reader.cancel()


class _Answers(Generic[T, R]):
    """The state one stream's reader and consumer share: what the stream holds (``held``,
    ``held_bytes``: read, not yet written), the answers ready to write, how it ended."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        bounds: StreamBounds,
        size_of: Callable[[Any], int],
        paused: PausedStreams | None,
    ) -> None:
        self._loop = loop
        self._bounds = bounds
        self._size_of = size_of
        self._paused = paused
        self.ready: deque[tuple[R, int]] = deque()
        """Answers not yet taken by the consumer, each with the bytes its request holds."""
        self.failure: BaseException | None = None
        self.ended = False
        self.held = 0
        self.held_bytes = 0
        self._pending: set[asyncio.Future[Any]] = set()
        self._read_all = False
        self._closed = False
        self._consumer: asyncio.Future[None] | None = None
        self._reader: asyncio.Future[None] | None = None

    def _full(self) -> bool:
        return self.held >= self._bounds.max_requests or self.held_bytes >= self._bounds.max_bytes

    async def read(self, requests: AsyncIterator[T], start: Callable[[T], R | Pending[R]]) -> None:
        try:
            async for request in requests:
                charge = self._size_of(request)
                self.held += 1
                self.held_bytes += charge
                outcome = start(request)
                del request  # a request answered at once is not kept while the stream waits
                hold = None
                if not isinstance(outcome, Pending):
                    self._deliver(outcome, charge)
                else:
                    self._pending.add(outcome.future)
                    outcome.future.add_done_callback(functools.partial(self._on_done, outcome.finish, charge))
                    hold = outcome.hold
                del outcome
                if hold is not None and not hold.done():
                    await hold  # the request waits for room in its model's queue: read nothing more
                del hold
                if self._full():
                    await self._wait_for_room()
            self._read_all = True
            if not self._pending:
                self._end()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the stream broke (client gone, oversized message)
            self._fail(exc)

    async def _wait_for_room(self) -> None:
        """Until written answers brought the stream under its bounds; counted as paused."""
        if self._paused is not None:
            self._paused.inc()
        try:
            while self._full():
                self._reader = self._loop.create_future()
                await self._reader
        finally:
            self._reader = None
            if self._paused is not None:
                self._paused.dec()

    def _on_done(
        self, finish: Callable[[asyncio.Future[Any]], R], charge: int, future: asyncio.Future[Any]
    ) -> None:
        self._pending.discard(future)
        try:
            answer = finish(future)
        except asyncio.CancelledError:
            self.written(charge)  # the request was cancelled with its stream: nothing to deliver
        except BaseException as exc:
            self.written(charge)
            self._fail(exc)
        else:
            if future.cancelled():
                self.written(charge)
            else:
                self._deliver(answer, charge)
        if self._read_all and not self._pending:
            self._end()

    def _deliver(self, answer: R, charge: int) -> None:
        if self._closed:
            return
        self.ready.append((answer, charge))
        self._wake_consumer()

    def written(self, charge: int) -> None:
        """An answer was written to the transport (or will never be): what its request held is
        free, and the reader goes on when the stream is under its bounds again."""
        self.held -= 1
        self.held_bytes -= charge
        reader = self._reader
        if reader is not None and not self._full():
            self._reader = None
            if not reader.done():
                reader.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self._wake_consumer()

    def _end(self) -> None:
        self.ended = True
        self._wake_consumer()

    def _wake_consumer(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            self._consumer = None
            if not consumer.done():
                consumer.set_result(None)

    async def wait(self) -> None:
        """Until an answer is ready, the stream failed or every answer is out."""
        self._consumer = self._loop.create_future()
        await self._consumer

    def close(self) -> None:
        """The consumer stopped: pending answers are not wanted any more."""
        self._closed = True
        for future in list(self._pending):
            future.cancel()
