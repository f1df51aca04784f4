"""The bytes that unary ``ModelInfer`` calls hold, bounded over the whole server, reading included.

gRPC reads a unary call's whole message (up to the message limit) before its handler runs, and a
stream's bound (``streaming.StreamBounds``) does not cover calls: many concurrent calls of large
messages would each be read and kept until the batcher answered them. So ``UnaryAdmission``
serves ``ModelInfer`` as a request-streaming call that reads its one message only once the
``UnaryBudget`` has room for a message of the largest size; the room is then cut to the
message's own size and held until the call is answered. A call that finds no room waits unread,
first come first served, holding no message bytes (how many calls wait is bounded by
``--max-concurrent-calls``). One call is always admitted while none is held, so one message up to
the message limit passes whatever the budget says.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from udfserve.services.model_server.core.memory_trim import MemoryTrimmer
from udfserve.services.model_server.observability.metrics import ServerMetrics

logger = logging.getLogger(__name__)

UNARY_INFERENCE_METHODS = frozenset({"/inference.GRPCInferenceService/ModelInfer"})
"""The unary calls that carry inference data; the others carry a few names and are left alone."""


class UnaryBudget:
    """Bytes of unary calls reserved for reading or read and not yet answered, and the most the
    server holds."""

    def __init__(
        self,
        limit_bytes: int,
        max_message_bytes: int,
        metrics: ServerMetrics,
        trimmer: MemoryTrimmer | None = None,
    ) -> None:
        if limit_bytes < 1 or max_message_bytes < 1:
            raise ValueError(
                f"the unary budget needs at least 1 byte and a message limit of at least 1 byte, "
                f"received {limit_bytes} and {max_message_bytes}"
            )
        self.limit_bytes = limit_bytes
        self.max_message_bytes = max_message_bytes
        self.held_bytes = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._gauge = metrics.unary_held_bytes
        self._waiting_gauge = metrics.unary_calls_waiting
        self._trimmer = trimmer
        """Told of every call's bytes once it is answered: large calls' freed memory goes back."""

    def _has_room(self) -> bool:
        return self.held_bytes == 0 or self.held_bytes + self.max_message_bytes <= self.limit_bytes

    async def reserve(self) -> int:
        """Room for one message of the largest size, once there is (first come first served);
        returns the bytes reserved, to ``settle`` once the message is read and ``release`` once
        the call is answered."""
        reserved = self.max_message_bytes
        if not self._waiting and self._has_room():
            self._hold(reserved)
            return reserved
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._waiting_gauge.inc()
        try:
            await waiter  # ``_wake`` reserved the room for this call before waking it
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(reserved)  # woken, but its client went away: the room goes on
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise
        finally:
            self._waiting_gauge.dec()
        return reserved

    def settle(self, reserved_bytes: int, size_bytes: int) -> int:
        """The message is read: hold its own size instead of the reservation; returns it."""
        self._hold(size_bytes - reserved_bytes)
        self._wake()
        return size_bytes

    def release(self, held_bytes: int) -> None:
        """The call is answered (or its client went away): its bytes are free."""
        self._hold(-held_bytes)
        self._wake()
        if self._trimmer is not None:
            self._trimmer.call_done(held_bytes)

    def _hold(self, delta_bytes: int) -> None:
        self.held_bytes += delta_bytes
        self._gauge.set(self.held_bytes)

    def _wake(self) -> None:
        """Reserve room for the waiting calls, first come first served, while there is room."""
        while self._waiting and self._has_room():
            waiter = self._waiting.popleft()
            if waiter.done():
                continue  # cancelled while waiting
            self._hold(self.max_message_bytes)
            waiter.set_result(None)


class UnaryAdmission(grpc.aio.ServerInterceptor):
    """Serves the unary inference calls through the ``UnaryBudget``: read once it has room."""

    def __init__(self, budget: UnaryBudget, methods: frozenset[str] = UNARY_INFERENCE_METHODS) -> None:
        self._budget = budget
        self._methods = methods

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler_call_details.method not in self._methods:
            return handler
        return _admitted(handler, self._budget)


def _admitted(handler: grpc.RpcMethodHandler, budget: UnaryBudget) -> grpc.RpcMethodHandler:
    """``handler`` (unary) as a request-streaming handler that reads its message within ``budget``
    (unary and request-streaming calls look the same on the wire). The message is taken as the
    bytes gRPC read, measured by their length (measuring a parsed message encodes it again), and
    parsed here with the handler's own deserializer."""
    behaviour = handler.unary_unary
    parse = handler.request_deserializer

    async def admitted(_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        held = await budget.reserve()
        try:
            # ``context.read``, not the request iterator: grpcio's iterator is an async generator
            # in a reference cycle with its owner, whose suspended frame keeps the message it
            # yielded alive until the cyclic garbage collector runs, which an idle server may
            # not do for a long time (8 answered calls of 60 MiB kept 480 MiB resident).
            raw = await context.read()
            if raw is grpc.aio.EOF:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "expected one request message, received none"
                )
            assert isinstance(raw, bytes)
            held = budget.settle(held, len(raw))
            try:
                request = parse(raw) if parse is not None else raw
            except DecodeError as exc:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request message of {len(raw)} bytes cannot be parsed ({exc}); expected "
                    "a serialized request of this method",
                )
            del raw
            return await behaviour(request, context)
        finally:
            budget.release(held)

    return grpc.stream_unary_rpc_method_handler(admitted, response_serializer=handler.response_serializer)
