"""Back-pressure from a full queue, and the standard gRPC health service per model."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_harness import batch_of, request, stream_predict

from udfserve.services.model_server.launcher import ServerProcess, launch_server

ROWS_PER_REQUEST = 8


@pytest.fixture(scope="module")
def small_queue_server(example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """sequence_bilstm with room for two requests in its queue, refusing at once what does not fit
    (``--room-wait-s 0``: a stream's request does not wait for room)."""
    repository = tmp_path_factory.mktemp("small-queue-repo")
    shutil.copytree(example_repository / "sequence_bilstm", repository / "sequence_bilstm")
    config = {
        "max_batch_size": ROWS_PER_REQUEST,
        "dynamic_batching": {"max_queue_delay_s": 0.001, "max_queue_rows": 2 * ROWS_PER_REQUEST},
    }
    (repository / "sequence_bilstm" / "config.yaml").write_text(yaml.safe_dump(config))
    process = launch_server(
        repository,
        socket=socket_dir / "q.sock",
        log_path=repository.parent / "q.log",
        extra_args=["--room-wait-s", "0"],
    )
    yield process
    process.terminate()


def test_a_full_queue_answers_resource_exhausted_and_everything_else_is_answered(
    small_queue_server: ServerProcess,
) -> None:
    rng = np.random.default_rng(0)
    burst = [
        request(
            "sequence_bilstm",
            batch_of({"lines": rng.normal(size=(ROWS_PER_REQUEST, 16, 32)).astype("f4")}),
            i,
        )
        for i in range(120)
    ]
    answers = stream_predict(small_queue_server.grpc_target(), burst)
    codes = [answers[i].code for i in range(120)]
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    refused = next(a for a in answers.values() if a.code == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "sequence_bilstm" in refused.message and "16" in refused.message
    retried = stream_predict(small_queue_server.grpc_target(), [burst[0]])
    assert retried[0].code == grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("service", "status"),
    [
        ("", health_pb2.HealthCheckResponse.SERVING),
        ("tabular_mlp", health_pb2.HealthCheckResponse.SERVING),
        ("multi_io", health_pb2.HealthCheckResponse.SERVING),
    ],
)
def test_grpc_health_reports_the_server_and_each_model(
    server: ServerProcess, service: str, status: int
) -> None:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10
        )
    assert reply.status == status


def test_grpc_health_of_an_unknown_model_is_not_found(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target()) as channel, pytest.raises(grpc.RpcError) as raised:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
