"""What the server holds for calls before they are admitted: a call without the token is refused
without its message being read, and unary calls hold at most the server's unary budget."""

from __future__ import annotations

import grpc
import pytest

from services.model_server.errors import ServerOverloaded
from services.model_server.frontends.kserve.unary_budget import UnaryBudget
from services.model_server.observability.metrics import ServerMetrics
from services.model_server.security import _refusing_handler


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


def test_a_unary_call_is_admitted_while_none_is_held_whatever_its_size() -> None:
    budget = UnaryBudget(1000, ServerMetrics("cpu"))
    budget.take(5000)
    assert budget.held_bytes == 5000


def test_a_unary_call_beyond_the_budget_is_refused_resource_exhausted_naming_the_flag() -> None:
    budget = UnaryBudget(1000, ServerMetrics("cpu"))
    budget.take(600)
    with pytest.raises(ServerOverloaded, match="--max-unary-held-bytes") as raised:
        budget.take(500)
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert budget.held_bytes == 600
    budget.give_back(600)
    budget.take(500)
    assert budget.held_bytes == 500
