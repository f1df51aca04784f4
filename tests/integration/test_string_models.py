"""Models that cast strings to numbers load and answer through both protocols: an ONNX graph
(``Cast`` from string) and a TensorFlow SavedModel (``tf.strings.to_number``), served by a real
server process and called through the Arrow protocol, KServe v2 gRPC (tritonclient, BYTES; the
python and the native front end) and KServe v2 HTTP (tritonclient.http, JSON and binary tensors).
Their synthetic warm-up fails on empty strings and is a warning; samples named in config.yaml
warm one up. What a client reads of a load failure names files from the repository down, never
the server's absolute paths."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from onnx_graphs import casting_graph, identity_graph, write_model
from server_harness import http_json, request, stream_predict
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess, launch_server

TESTS_DIR = Path(__file__).resolve().parents[1]
ONNX = "casting_onnx"
SAMPLED = "casting_sampled"
TF = "casting_tf"
BROKEN = "broken"
SAMPLES = 'warmup:\n  samples:\n    - {text: [["1.5"], ["-2"]]}\n'
TEXTS = ["1.5", "-2", "1e3", " 7 "]
VALUES = [1.5, -2.0, 1000.0, 7.0]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("string-models") / "repository"
    write_model(root, ONNX, casting_graph())
    write_model(root, SAMPLED, casting_graph(), config=SAMPLES)
    write_model(root, BROKEN, identity_graph(), config="inputs: [{name: x, shape: [5]}]\n")
    subprocess.run(
        [sys.executable, str(TESTS_DIR / "casting_savedmodel.py"), str(root / TF / "1")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


@pytest.fixture(scope="module")
def server(repository: Path, socket_dir: Path) -> Iterator[ServerProcess]:
    process = launch_server(
        repository,
        socket=socket_dir / "string-models.sock",
        log_path=repository.parent / "server.log",
        extra_args=["--kserve-http-port", "0", "--kserve-frontend", "native", "--kserve-port", "0"],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module", params=["python", "native"])
def grpc_client(
    request: pytest.FixtureRequest, server: ServerProcess
) -> Iterator[triton_grpc.InferenceServerClient]:
    """tritonclient on the KServe gRPC front end of each kind: the python one shares the Arrow
    protocol's port, the native one (``--kserve-frontend native``) listens on its own."""
    address = server.tcp_address if request.param == "python" else server.kserve_address
    assert address is not None
    with triton_grpc.InferenceServerClient(address) as client:
        yield client


@pytest.fixture(scope="module")
def http_client(server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    assert server.kserve_http_address is not None
    with triton_http.InferenceServerClient(server.kserve_http_address) as client:
        yield client


def strings(model: str, values: list[str]) -> np.ndarray:
    """The rows of ``model``'s string input: (rows, 1) for the ONNX graphs, (rows,) for TF."""
    flat = np.array([value.encode() for value in values], dtype=object)
    return flat if model == TF else flat.reshape(-1, 1)


def server_log(repository: Path) -> str:
    return (repository.parent / "server.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("model", [ONNX, SAMPLED, TF])
def test_a_model_casting_strings_to_numbers_is_ready_on_both_protocols(
    model: str, grpc_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    assert grpc_client.is_model_ready(model)
    assert http_client.is_model_ready(model)
    metadata = grpc_client.get_model_metadata(model, as_json=True)
    assert [(tensor["name"], tensor["datatype"]) for tensor in metadata["inputs"]] == [("text", "BYTES")]


@pytest.mark.parametrize("model", [ONNX, SAMPLED, TF])
def test_strings_cast_to_numbers_through_the_arrow_protocol(model: str, server: ServerProcess) -> None:
    column = pa.array(TEXTS, pa.string())
    if model != TF:
        column = pa.FixedSizeListArray.from_arrays(column, 1)
    batch = pa.record_batch({"text": column})

    answer = stream_predict(server.grpc_target(), [request(model, batch)])[0]

    assert answer.code == grpc.StatusCode.OK, answer.message
    assert answer.outputs is not None
    values = answer.outputs.column("value")
    flat = values.flatten() if pa.types.is_fixed_size_list(values.type) else values
    np.testing.assert_array_equal(flat.to_numpy(), VALUES)


@pytest.mark.parametrize("model", [ONNX, SAMPLED, TF])
def test_bytes_cast_to_numbers_through_kserve_grpc(
    model: str, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    texts = strings(model, TEXTS)
    tensor = triton_grpc.InferInput("text", list(texts.shape), "BYTES").set_data_from_numpy(texts)

    answer = grpc_client.infer(model, [tensor]).as_numpy("value")

    np.testing.assert_array_equal(answer.reshape(-1), VALUES)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model", [ONNX, TF])
def test_bytes_cast_to_numbers_through_kserve_http(
    model: str, binary: bool, http_client: triton_http.InferenceServerClient
) -> None:
    texts = strings(model, TEXTS)
    tensor = triton_http.InferInput("text", list(texts.shape), "BYTES")
    tensor.set_data_from_numpy(texts, binary_data=binary)
    output = triton_http.InferRequestedOutput("value", binary_data=binary)

    answer = http_client.infer(model, [tensor], outputs=[output]).as_numpy("value")

    np.testing.assert_array_equal(answer.reshape(-1), VALUES)


@pytest.mark.parametrize("model", [ONNX, TF])
def test_a_string_that_is_no_number_is_refused_on_both_protocols_naming_the_model(
    model: str, grpc_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    texts = strings(model, ["1", "one"])
    grpc_tensor = triton_grpc.InferInput("text", list(texts.shape), "BYTES").set_data_from_numpy(texts)
    http_tensor = triton_http.InferInput("text", list(texts.shape), "BYTES")
    http_tensor.set_data_from_numpy(texts, binary_data=False)

    with pytest.raises(InferenceServerException) as over_grpc:
        grpc_client.infer(model, [grpc_tensor])
    with pytest.raises(InferenceServerException) as over_http:
        http_client.infer(model, [http_tensor])

    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert over_http.value.status() == "400"
    assert repr(model) in over_grpc.value.message() and repr(model) in over_http.value.message()


def test_the_synthetic_warmup_failure_is_a_warning_in_the_log_and_samples_need_none(
    server: ServerProcess, repository: Path
) -> None:
    log = server_log(repository)

    warned = [line for line in log.splitlines() if "loaded without a warm-up" in line]
    assert any(f"model '{ONNX}' version 1" in line for line in warned)
    assert any(f"model '{TF}' version 1" in line for line in warned)
    assert not any(f"model '{SAMPLED}'" in line for line in warned)


def test_a_load_failure_reads_from_the_repository_down_on_every_protocol(
    server: ServerProcess,
    repository: Path,
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
) -> None:
    absolute = str(repository.resolve())
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc_client.get_model_metadata(BROKEN)
    with pytest.raises(InferenceServerException) as over_http:
        http_client.get_model_metadata(BROKEN)
    index = grpc_client.get_model_repository_index(as_json=True)["models"]
    _, listed = http_json(server.http_address, "/v1/models")

    reason = next(entry["reason"] for entry in index if entry["name"] == BROKEN)
    error = next(entry["error"] for entry in listed if entry["name"] == BROKEN)  # type: ignore[union-attr]
    for text in (over_grpc.value.message(), over_http.value.message(), reason, error):
        assert f"{BROKEN}/1/model.onnx" in text and absolute not in text
    assert f"{absolute}/{BROKEN}/1/model.onnx" in server_log(repository)
