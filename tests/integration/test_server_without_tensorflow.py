"""A server installed without TensorFlow and without tritonclient (``udfserve[server,onnx]``)
starts, serves its ONNX models over both protocols, and reports a Keras model by name with the
extra that installs TensorFlow.

TensorFlow is an extra of its own and the KServe messages are the project's own generated code,
so an ONNX-only node does not install 1.8 GiB it never imports, nor tritonclient. The server runs
in a real child process whose Python cannot import either (``running_server_without``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from onnx_graphs import SCORED_TABLE_ROWS, scored_graph, write_model
from server_harness import batch_of, http_json, request, running_server_without, stream_predict

from udfserve.services.model_server.launcher import ServerProcess

pytestmark = pytest.mark.integration

ROWS = 6


@pytest.fixture(scope="module")
def onnx_only_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("onnx_only")
    shutil.copytree(example_repository / "tabular_mlp", repository / "tabular_mlp")
    write_model(repository, "scored", scored_graph())
    with running_server_without(
        ["tensorflow", "tritonclient"], repository, socket_dir, tmp_path_factory, "onnx-only"
    ) as process:
        yield process


def _scored_inputs() -> dict[str, np.ndarray]:
    return {
        "amount": np.random.default_rng(3).standard_normal((ROWS, 3)).astype(np.float32),
        "code": np.arange(ROWS, dtype=np.int64) % SCORED_TABLE_ROWS,
    }


def test_an_onnx_model_is_served_over_the_arrow_protocol(onnx_only_server: ServerProcess) -> None:
    answer = stream_predict(onnx_only_server.grpc_target(), [request("scored", batch_of(_scored_inputs()))])[
        0
    ]

    assert answer.outputs is not None, answer.message
    assert answer.outputs.num_rows == ROWS


def test_an_onnx_model_is_served_over_kserve_without_tritonclient_in_the_server(
    onnx_only_server: ServerProcess,
) -> None:
    client = triton_grpc.InferenceServerClient(onnx_only_server.kserve_target())
    infer_inputs = []
    for name, values in _scored_inputs().items():
        datatype = "FP32" if name == "amount" else "INT64"
        infer_input = triton_grpc.InferInput(name, list(values.shape), datatype)
        infer_input.set_data_from_numpy(values)
        infer_inputs.append(infer_input)

    result = client.infer("scored", infer_inputs, outputs=[triton_grpc.InferRequestedOutput("score")])
    client.close()

    score = result.as_numpy("score")
    assert score is not None and score.shape[0] == ROWS


def test_a_keras_model_is_reported_with_the_tensorflow_extra(onnx_only_server: ServerProcess) -> None:
    status, info = http_json(onnx_only_server.http_address or "", "/v1/models/tabular_mlp")

    assert status == 200 and isinstance(info, dict)
    assert info["served_versions"] == []
    assert "pip install 'udfserve[tensorflow]'" in info["error"]
