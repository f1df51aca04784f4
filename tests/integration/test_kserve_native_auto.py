"""``--kserve-frontend auto``, the default: the native front end wherever its module loads and a
KServe port is given, else the python one, which then listens on that port too; the ready file
says which serves (``kserve_frontend``), and the start-up log says why.

Which front end answers is told by what only one of them does: the native port refuses
``ModelStreamInfer`` (UNIMPLEMENTED, naming the main port), the python front end serves streams.
The fallback runs in a real child process whose Python cannot import the compiled module
(``running_server_without``), as a server installed from a wheel built without grpc++.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from server_harness import running_server, running_server_without
from tritonclient.grpc import service_pb2, service_pb2_grpc

from udfserve.services.model_server.frontends.kserve.native import BUILD_COMMAND, load_frontend_module
from udfserve.services.model_server.launcher import ServerProcess

pytestmark = pytest.mark.integration

NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"
AUTO_WITH_PORT = ["--models", "tabular_mlp", "--kserve-frontend", "auto", "--kserve-port", "0"]


@pytest.fixture(scope="module")
def auto_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    load_frontend_module()  # this environment has it built (scripts/native.sh): auto must pick it
    with running_server(
        tabular_onnx_repository, socket_dir, tmp_path_factory, "auto-native", AUTO_WITH_PORT
    ) as process:
        yield process


@pytest.fixture(scope="module")
def fallback_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server_without(
        [NATIVE_MODULE], tabular_onnx_repository, socket_dir, tmp_path_factory, "auto-python", AUTO_WITH_PORT
    ) as process:
        yield process


def infer_rows(address: str, rows: int) -> np.ndarray:
    tensor = triton.InferInput("features", [rows, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 64), np.float32))
    with triton.InferenceServerClient(address) as client:
        return client.infer("tabular_mlp", [tensor]).as_numpy("probabilities")


def stream_answer(address: str) -> grpc.StatusCode | int:
    """A one-request ``ModelStreamInfer`` on ``address``: its status code when refused, else the
    rows of the answer."""
    request = service_pb2.ModelInferRequest(model_name="tabular_mlp")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[2, 64])
    tensor.contents.fp32_contents.extend([1.0] * 128)
    with grpc.insecure_channel(address) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([request]), timeout=60
        )
        try:
            answers = list(stream)
        except grpc.RpcError as error:
            return error.code()
    assert answers and not answers[0].error_message, answers
    return int(answers[0].infer_response.outputs[0].shape[0])


def test_auto_with_a_port_serves_with_the_native_front_end_where_it_is_built(
    auto_server: ServerProcess,
) -> None:
    assert auto_server.kserve_frontend == "native"
    assert auto_server.kserve_address is not None
    assert infer_rows(auto_server.kserve_address, 3).shape == (3, 8)
    assert stream_answer(auto_server.kserve_address) == grpc.StatusCode.UNIMPLEMENTED  # the native port's own


def test_auto_says_in_its_start_up_log_that_the_native_front_end_serves_and_why(
    auto_server: ServerProcess,
) -> None:
    assert "KServe front end: native" in auto_server.log_tail(200)
    assert "the native module is built here and loads" in auto_server.log_tail(200)


def test_auto_without_the_module_serves_the_kserve_port_with_the_python_front_end(
    fallback_server: ServerProcess,
) -> None:
    assert fallback_server.kserve_frontend == "python"
    assert fallback_server.kserve_address is not None
    assert fallback_server.kserve_address != fallback_server.tcp_address
    assert infer_rows(fallback_server.kserve_address, 3).shape == (3, 8)
    assert stream_answer(fallback_server.kserve_address) == 2  # the python front end serves streams


def test_auto_without_the_module_warns_naming_the_build_command(fallback_server: ServerProcess) -> None:
    log = fallback_server.log_tail(200)
    line = next((line for line in log.splitlines() if "KServe front end: python" in line), "")
    assert "WARNING" in line and "fell back" in line and BUILD_COMMAND in line, log


def test_auto_without_a_port_serves_kserve_on_the_main_listeners_only(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with running_server(
        tabular_onnx_repository, socket_dir, tmp_path_factory, "auto-no-port", ["--models", "tabular_mlp"]
    ) as process:
        assert (process.kserve_frontend, process.kserve_address) == ("python", None)
        assert process.tcp_address is not None
        assert infer_rows(process.tcp_address, 2).shape == (2, 8)
