"""Requests that do not parse as their message are INVALID_ARGUMENT, on every RPC of a service.

gRPC's Python server parses each request with the deserializer the generated code registers,
and answers UNKNOWN when it raises: a status that says nothing of whose fault it is, where the
native KServe front end answers the same bytes INVALID_ARGUMENT. ``add_service`` registers a
service through its generated ``add_..._to_server`` function, but with handlers that receive the
raw bytes and parse them themselves: a message that does not parse is answered
INVALID_ARGUMENT naming the message type (unary calls), or ends its stream with that status
after the answers to the requests before it (streams).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

UNREADABLE = "the request cannot be parsed as {}; expected a serialized message of that type"

Parse = Callable[[bytes], Any]


class _Collector:
    """Stands in for the server while the generated function registers its handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """The generated code registers the same handlers twice: kept from the other call."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.service, self.handlers = service, dict(handlers)


def add_service(
    add_to_server: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    parsed_by_the_servicer: frozenset[str] = frozenset(),
) -> None:
    """``add_to_server(servicer, server)``, each request parsed by the handler rather than gRPC.

    The methods in ``parsed_by_the_servicer`` (full names, ``/package.Service/Method``) keep their
    generated handlers: the inference streams, which an interceptor hands their requests as the
    bytes gRPC read, so that they count what they hold and parse it themselves.
    """
    collector = _Collector()
    add_to_server(servicer, collector)
    handlers = {
        name: (
            handler
            if f"/{collector.service}/{name}" in parsed_by_the_servicer
            else _parsing_handler(f"{collector.service}.{name}", handler)
        )
        for name, handler in collector.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(collector.service, handlers),))
    server.add_registered_method_handlers(collector.service, handlers)


def _parsing_handler(method: str, handler: Any) -> grpc.RpcMethodHandler:
    parse: Parse | None = handler.request_deserializer
    if parse is None:
        return handler
    message_type = _message_type(parse, method)
    unreadable = UNREADABLE.format(message_type)

    def parsed(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError:
            return None

    if handler.unary_unary is not None or handler.unary_stream is not None:
        behaviour = handler.unary_unary or handler.unary_stream
        if handler.unary_unary is not None:

            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                request = parsed(raw)
                if request is None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unreadable)
                result = behaviour(request, context)
                return await result if inspect.isawaitable(result) else result

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=None, response_serializer=handler.response_serializer
            )

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request = parsed(raw)
            if request is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unreadable)
            async for answer in behaviour(request, context):
                yield answer

        async def unary_writing(raw: bytes, context: grpc.aio.ServicerContext) -> None:
            """For a handler that answers with ``context.write`` (grpc_health's ``Watch``)."""
            request = parsed(raw)
            if request is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unreadable)
            await behaviour(request, context)

        writes = not inspect.isasyncgenfunction(behaviour)
        return grpc.unary_stream_rpc_method_handler(
            unary_writing if writes else unary_stream,
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )

    def requests_until_unreadable(
        raw_requests: AsyncIterator[bytes], failed: list[bool]
    ) -> AsyncIterator[Any]:
        async def requests() -> AsyncIterator[Any]:
            async for raw in raw_requests:
                request = parsed(raw)
                if request is None:
                    failed.append(True)
                    return
                yield request

        return requests()

    if handler.stream_stream is not None:
        stream_behaviour = handler.stream_stream

        async def stream_stream(
            raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            failed: list[bool] = []
            async for answer in stream_behaviour(requests_until_unreadable(raw_requests, failed), context):
                yield answer
            if failed:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unreadable)

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=None, response_serializer=handler.response_serializer
        )

    unary_behaviour = handler.stream_unary

    async def stream_unary(raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        failed: list[bool] = []
        result = unary_behaviour(requests_until_unreadable(raw_requests, failed), context)
        answer = await result if inspect.isawaitable(result) else result
        if failed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unreadable)
        return answer

    return grpc.stream_unary_rpc_method_handler(
        stream_unary, request_deserializer=None, response_serializer=handler.response_serializer
    )


def _message_type(parse: Parse, method: str) -> str:
    """The full name of the message ``parse`` reads (``Message.FromString``), for the refusal."""
    owner = getattr(parse, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return descriptor.full_name if descriptor is not None else f"the request of {method}"
