"""What clients send cannot make the server's log grow at their will: every client-supplied string
in a log line is clipped, so 20 requests with a 4 MiB id add a bounded amount of log."""

from __future__ import annotations

import grpc
import numpy as np
from server_harness import batch_of, module_server, request, stream_predict
from tritonclient.grpc import service_pb2_grpc

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.wire.kserve_messages import arrow_batch_to_infer_request

server = module_server("logs", ["--models", "multi_io"])

HUGE = 4 << 20
REQUESTS = 20
LOG_GROWTH_BOUND = 64 << 10
"""Bytes of log 20 refused requests may add: a few hundred bytes a line, clipped ids included."""


def multi_io(categories: list[int]):
    rows = len(categories)
    return batch_of({"numeric": np.zeros((rows, 8), np.float32), "category": np.array(categories, np.int32)})


def log_size(server: ServerProcess) -> int:
    assert server.log_path is not None
    return server.log_path.stat().st_size


def test_requests_with_a_4_mib_id_add_a_bounded_amount_of_log(server: ServerProcess) -> None:
    huge_id = "i" * HUGE
    before = log_size(server)
    codes = []
    with grpc.insecure_channel(
        server.kserve_target(), options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for index in range(REQUESTS):
            model = "no_such_model" if index % 2 else "multi_io"
            message = arrow_batch_to_infer_request(multi_io([1, 99]), model, request_id=huge_id)
            try:
                stub.ModelInfer(message, timeout=60)
            except grpc.RpcError as refused:
                codes.append(refused.code())
    assert set(codes) == {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}
    assert log_size(server) - before <= LOG_GROWTH_BOUND


def test_arrow_requests_naming_a_4_mib_model_add_a_bounded_amount_of_log(server: ServerProcess) -> None:
    before = log_size(server)
    huge_name = "m" * HUGE
    for index in range(REQUESTS):
        answer = stream_predict(server.grpc_target(), [request(huge_name, multi_io([1]), batch_id=index)])
        assert answer[index].code == grpc.StatusCode.INVALID_ARGUMENT
    assert log_size(server) - before <= LOG_GROWTH_BOUND


def test_a_kserve_stream_of_requests_with_a_4_mib_id_adds_a_bounded_amount_of_log(
    server: ServerProcess,
) -> None:
    before = log_size(server)
    huge_id = "s" * HUGE
    messages = [
        arrow_batch_to_infer_request(multi_io([1, 1000]), "multi_io", request_id=f"{index}{huge_id}")
        for index in range(REQUESTS)
    ]
    with grpc.insecure_channel(
        server.grpc_target(),
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    ) as channel:
        answers = list(
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages), timeout=120)
        )
    assert len(answers) == REQUESTS and all("'category'" in answer.error_message for answer in answers)
    assert log_size(server) - before <= LOG_GROWTH_BOUND
