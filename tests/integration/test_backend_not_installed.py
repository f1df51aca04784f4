"""A model whose backend is not installed is reported at start-up by name, with the extra that
installs it, and the server serves its other models.

The server runs in a real child process whose Python cannot import onnxruntime
(``running_server_without``), while this test's environment has it (the other tests need it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx_graphs import scored_graph, write_model
from server_harness import batch_of, http_json, request, running_server_without, stream_predict

from udfserve.services.model_server.launcher import ServerProcess


@pytest.fixture(scope="module")
def server_without_onnxruntime(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("mixed_backends")
    shutil.copytree(example_repository / "tabular_mlp", repository / "tabular_mlp")
    write_model(repository, "scored", scored_graph())
    with running_server_without(
        ["onnxruntime"], repository, socket_dir, tmp_path_factory, "no-onnxruntime"
    ) as process:
        yield process


def test_the_model_is_reported_at_start_up_by_name_with_the_extra_to_install(
    server_without_onnxruntime: ServerProcess,
) -> None:
    errors = [
        line for line in server_without_onnxruntime.log_tail(lines=1_000).splitlines() if " ERROR " in line
    ]

    reported = [line for line in errors if "model 'scored' version 1" in line]
    assert len(reported) == 1, errors
    assert "the onnxruntime backend (for an ONNX graph) is not installed here" in reported[0]
    assert "pip install 'udfserve[onnx]'" in reported[0]


def test_the_model_is_listed_as_not_serving_with_the_same_reason_and_the_server_is_ready(
    server_without_onnxruntime: ServerProcess,
) -> None:
    status, info = http_json(server_without_onnxruntime.http_address or "", "/v1/models/scored")

    assert status == 200 and isinstance(info, dict)
    assert info["state"] != "ready" and info["served_versions"] == []
    assert "pip install 'udfserve[onnx]'" in info["error"]
    status, readiness = http_json(server_without_onnxruntime.http_address or "", "/health/ready")
    assert status == 200 and isinstance(readiness, dict) and readiness["ready"] is True
    assert "pip install 'udfserve[onnx]'" in readiness["failed"]["scored"]


def test_the_other_models_are_served(server_without_onnxruntime: ServerProcess) -> None:
    features = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)

    answer = stream_predict(
        server_without_onnxruntime.grpc_target(), [request("tabular_mlp", batch_of({"features": features}))]
    )[0]

    assert answer.outputs is not None, answer.message
    assert answer.outputs.num_rows == 5
