"""What the server holds for calls before they are admitted: a call without the token is refused
without its message being read, and unary calls are read only within the server's unary budget."""

from __future__ import annotations

import asyncio
import gc

import grpc
import pytest

from udfserve.protocol import inference_pb2 as pb
from udfserve.services.model_server.frontends.kserve.unary_budget import UnaryAdmission, UnaryBudget
from udfserve.services.model_server.frontends.streaming import (
    RawStreamRequests,
    UnparseableRequest,
    parse_request,
)
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.security import _refusing_handler


async def _unary(request: bytes, context: object) -> bytes:
    return request


@pytest.mark.parametrize(
    "handler",
    [
        grpc.unary_unary_rpc_method_handler(_unary),
        grpc.unary_stream_rpc_method_handler(_unary),
        grpc.stream_unary_rpc_method_handler(_unary),
        grpc.stream_stream_rpc_method_handler(_unary),
    ],
    ids=["unary-unary", "unary-stream", "stream-unary", "stream-stream"],
)
def test_the_refusal_of_a_call_without_the_token_reads_no_message(handler: grpc.RpcMethodHandler) -> None:
    refusal = _refusing_handler(handler)
    assert refusal.request_streaming  # gRPC reads a unary handler's message before calling it
    assert refusal.response_streaming == handler.response_streaming


def budget(limit_bytes: int, max_message_bytes: int) -> UnaryBudget:
    return UnaryBudget(limit_bytes, max_message_bytes, ServerMetrics("cpu"))


async def settled(task: asyncio.Task[int]) -> bool:
    """Whether ``task`` finished once the event loop had its turns."""
    for _ in range(10):
        await asyncio.sleep(0)
    return task.done()


def test_a_unary_call_is_read_while_none_is_held_whatever_the_message_limit() -> None:
    async def body() -> int:
        unary = budget(1000, 5000)
        return await asyncio.wait_for(unary.reserve(), timeout=8)

    assert asyncio.run(body()) == 5000


def test_a_unary_call_waits_unread_until_the_budget_has_room_for_a_message_of_the_limit() -> None:
    async def body() -> None:
        unary = budget(1000, 400)
        first = await unary.reserve()
        second = await unary.reserve()  # 800 of 1000 reserved
        third = asyncio.ensure_future(unary.reserve())
        assert not await settled(third)
        first = unary.settle(first, 100)  # the first message was 100 bytes: 500 held
        assert await settled(third)
        assert unary.held_bytes == 900
        fourth = asyncio.ensure_future(unary.reserve())
        assert not await settled(fourth)
        unary.release(first)
        unary.release(second)
        assert await settled(fourth)
        unary.release(await third)
        unary.release(await fourth)
        assert unary.held_bytes == 0

    asyncio.run(asyncio.wait_for(body(), timeout=8))


def test_waiting_unary_calls_are_read_first_come_first_served_and_a_cancelled_one_is_skipped() -> None:
    async def body() -> None:
        unary = budget(100, 100)
        held = await unary.reserve()
        order: list[str] = []

        async def call(name: str) -> int:
            reserved = await unary.reserve()
            order.append(name)
            return reserved

        waiting = {name: asyncio.ensure_future(call(name)) for name in ("a", "b", "c")}
        await settled(waiting["c"])
        waiting["a"].cancel()
        unary.release(held)
        unary.release(await waiting["b"])
        unary.release(await waiting["c"])
        assert order == ["b", "c"]

    asyncio.run(asyncio.wait_for(body(), timeout=8))


def test_a_stream_message_that_is_not_the_request_is_invalid_argument_naming_the_type() -> None:
    with pytest.raises(
        UnparseableRequest, match=r"cannot be parsed as udfserve\.v1\.PredictRequest"
    ) as raised:
        parse_request(pb.PredictRequest, b"\xff\xff\xff")
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


def intercepted(interceptor: grpc.aio.ServerInterceptor, method: str, handler: grpc.RpcMethodHandler):
    async def continuation(_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return handler

    class Details(grpc.HandlerCallDetails):
        def __init__(self) -> None:
            self.method = method
            self.invocation_metadata = ()

    return asyncio.run(interceptor.intercept_service(continuation, Details()))


def test_model_infer_is_served_request_streaming_so_its_message_is_read_within_the_budget() -> None:
    handler = grpc.unary_unary_rpc_method_handler(_unary, request_deserializer=pb.PredictRequest.FromString)
    admission = UnaryAdmission(budget(1000, 100))
    served = intercepted(admission, "/inference.GRPCInferenceService/ModelInfer", handler)
    assert served.request_streaming and not served.response_streaming
    assert served.request_deserializer is None  # read as bytes, measured, then parsed
    assert intercepted(admission, "/inference.GRPCInferenceService/ServerLive", handler) is handler


def test_the_inference_streams_take_their_requests_unparsed() -> None:
    handler = grpc.stream_stream_rpc_method_handler(_unary, request_deserializer=pb.PredictRequest.FromString)
    served = intercepted(RawStreamRequests(), "/udfserve.v1.Inference/Predict", handler)
    assert served.request_deserializer is None and served.stream_stream is _unary
    assert intercepted(RawStreamRequests(), "/grpc.health.v1.Health/Watch", handler) is handler


def _live_request_iterators() -> int:
    """The frames of grpcio's request iterators (``_MessageReceiver._async_message_receiver``, a
    Cython async generator, whose scope holds the message it yielded) not yet collected."""
    return sum(1 for item in gc.get_objects() if type(item).__name__.endswith("_async_message_receiver"))


def test_an_answered_unary_call_leaves_nothing_that_holds_its_message() -> None:
    """grpcio's request iterator is an async generator in a reference cycle whose suspended frame
    holds the last message it yielded, until the cyclic collector runs: the admission reads the
    message with ``context.read()`` instead, so an answered call leaves no such iterator."""

    async def echo_size(request: bytes, context: object) -> bytes:
        return str(len(request)).encode()

    async def scenario() -> tuple[bytes, int]:
        handler = grpc.unary_unary_rpc_method_handler(echo_size)
        server = grpc.aio.server(interceptors=[UnaryAdmission(budget(1 << 30, 1 << 20))])
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                answer = await channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(bytes(1000))
            return answer, _live_request_iterators()
        finally:
            await server.stop(None)

    gc.collect()
    gc.disable()  # what only the collector would free must show
    try:
        answer, iterators = asyncio.run(scenario())
    finally:
        gc.enable()
    assert answer == b"1000"
    assert iterators == 0
