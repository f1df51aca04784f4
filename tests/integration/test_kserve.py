"""The KServe v2 / Triton gRPC protocol, spoken by tritonclient to a real udfserve process.

Every test runs against both front ends (``--kserve-frontend python`` and ``native``). The
python one serves the Arrow service and the KServe service on one port; the native one serves
unary KServe calls on a port of its own, and streams stay on the main port. The answers of both
protocols come from the same batcher, so KServe predictions are checked against the Arrow path's.
FP64, INT64 and BOOL reach real model inputs through copies of the example models whose
config.yaml declares those dtypes (the TensorFlow backend casts inside the graph); BYTES reaches
the string input of ``text_hashing``, checked against the Keras model in this process.
"""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
import tritonclient.grpc as triton
import yaml
from server_harness import (
    batch_of,
    column_to_numpy,
    http_json,
    keras_reference,
    metric_value,
    request,
    scrape,
    stream_predict,
)
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client.wire.kserve_messages import (
    arrow_batch_to_infer_request,
    infer_response_to_arrow,
    specs_from_config,
)

SMALL_QUEUE_ROWS = 8


@pytest.fixture(scope="module", params=["python", "native"])
def kserve_server(
    request: pytest.FixtureRequest,
    example_repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("kserve-repo")
    for name in ("tabular_mlp", "multi_io", "text_hashing"):
        shutil.copytree(example_repository / name, repository / name)
    variants = {
        "multi_io_bool": (
            "multi_io",
            {"inputs": [{"name": "category", "dtype": "bool"}, {"name": "numeric", "shape": [8]}]},
        ),
        "multi_io_wide": (
            "multi_io",
            {
                "inputs": [
                    {"name": "category", "dtype": "int64"},
                    {"name": "numeric", "dtype": "float64", "shape": [8]},
                ],
                "outputs": [
                    {"name": "score", "dtype": "float64"},
                    {"name": "embedding", "dtype": "float64", "shape": [4]},
                ],
            },
        ),
        "small_queue": (
            "sequence_bilstm",
            {
                "max_batch_size": SMALL_QUEUE_ROWS,
                "dynamic_batching": {"max_queue_delay_s": 0.001, "max_queue_rows": 2 * SMALL_QUEUE_ROWS},
            },
        ),
    }
    for name, (origin, config) in variants.items():
        shutil.copytree(example_repository / origin, repository / name)
        (repository / name / "config.yaml").write_text(yaml.safe_dump({"name": name, **config}))
    frontend = ["--kserve-frontend", "native", "--kserve-port", "0"] if request.param == "native" else []
    process = launch_server(
        repository,
        socket=socket_dir / f"kserve-{request.param}.sock",
        log_path=repository.parent / f"kserve-{request.param}.log",
        extra_args=frontend,
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def client(kserve_server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(kserve_server.kserve_target()) as triton_client:
        yield triton_client


def tensor(name: str, values: np.ndarray, datatype: str | None = None) -> triton.InferInput:
    datatype = (
        datatype
        or {
            "float32": "FP32",
            "float64": "FP64",
            "int32": "INT32",
            "int64": "INT64",
            "bool": "BOOL",
            "object": "BYTES",
        }[values.dtype.name]
    )
    infer_input = triton.InferInput(name, list(values.shape), datatype)
    return infer_input.set_data_from_numpy(values)


def features(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, 64)).astype(np.float32)


def multi_io_inputs(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rows)
    return rng.normal(size=(rows, 8)).astype(np.float32), rng.integers(0, 16, size=rows).astype(np.int32)


def texts(rows: int) -> np.ndarray:
    """Strings as tritonclient takes them: an object array of bytes, UTF-8 beyond ASCII included."""
    words = np.random.default_rng(rows).integers(0, 1000, size=rows)
    return np.array([f"texte n°{word}".encode() for word in words], dtype=object)


def arrow_answer(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same model's answer through the Arrow protocol of the same server."""
    answer = stream_predict(server.grpc_target(), [request(model, batch_of(inputs))])[0]
    assert answer.outputs is not None, answer.message
    return {name: column_to_numpy(answer.outputs.column(name)) for name in answer.outputs.schema.names}


def refusal(client: triton.InferenceServerClient, model: str, inputs: list[triton.InferInput]):
    with pytest.raises(InferenceServerException) as raised:
        client.infer(model, inputs)
    return raised.value


# -- health and metadata -----------------------------------------------------------------------
def test_server_is_live_and_ready(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


def test_a_served_model_is_ready_and_an_unknown_one_is_not(client: triton.InferenceServerClient) -> None:
    assert client.is_model_ready("tabular_mlp")
    assert client.is_model_ready("tabular_mlp", "1")
    assert not client.is_model_ready("tabular_mlp", "7")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata_names_udfserve_and_exactly_the_extensions_it_serves(
    client: triton.InferenceServerClient,
) -> None:
    metadata = client.get_server_metadata()
    assert metadata.name == "udfserve"
    served = ["model_configuration", "model_repository", "statistics", "system_shared_memory"]
    assert list(metadata.extensions) == served


def test_model_metadata_gives_datatypes_and_shapes_with_a_batch_dimension(
    client: triton.InferenceServerClient,
) -> None:
    metadata = client.get_model_metadata("multi_io")
    assert metadata.versions == ["1"]
    inputs = {t.name: (t.datatype, list(t.shape)) for t in metadata.inputs}
    outputs = {t.name: (t.datatype, list(t.shape)) for t in metadata.outputs}
    assert inputs == {"category": ("INT32", [-1, 1]), "numeric": ("FP32", [-1, 8])}
    assert outputs == {"score": ("FP32", [-1, 1]), "embedding": ("FP32", [-1, 4])}


def test_model_config_gives_max_batch_size_dims_and_the_queue_delay(
    client: triton.InferenceServerClient,
) -> None:
    config = client.get_model_config("tabular_mlp").config
    assert config.max_batch_size == 4096
    assert [(i.name, list(i.dims)) for i in config.input] == [("features", [64])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("probabilities", [8])]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000


def test_a_string_input_is_advertised_as_bytes_and_type_string(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("text_hashing")
    config = client.get_model_config("text_hashing").config
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [("text", "BYTES", [-1, 1])]
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("text", model_config_pb2.TYPE_STRING, [1])
    ]


def test_metadata_of_an_unknown_model_is_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("no_such_model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in raised.value.message()


# -- inference, one dtype at a time ------------------------------------------------------------
def test_fp32_inference_equals_the_arrow_path(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    x = features(5)
    result = client.infer("tabular_mlp", [tensor("features", x)], request_id="fp32")
    expected = arrow_answer(kserve_server, "tabular_mlp", {"features": x})["probabilities"]
    assert result.get_response().id == "fp32"
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_fp64_is_narrowed_for_a_float32_input(client: triton.InferenceServerClient) -> None:
    x = features(4)
    narrowed = client.infer("tabular_mlp", [tensor("features", x.astype(np.float64))])
    native = client.infer("tabular_mlp", [tensor("features", x)])
    assert narrowed.as_numpy("probabilities").dtype == np.float32
    np.testing.assert_allclose(
        narrowed.as_numpy("probabilities"), native.as_numpy("probabilities"), rtol=1e-5, atol=1e-6
    )


def test_int32_scalar_input_equals_the_arrow_path(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    numeric, category = multi_io_inputs(6)
    result = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category)])
    expected = arrow_answer(kserve_server, "multi_io", {"numeric": numeric, "category": category})
    assert result.as_numpy("score").shape == (6, 1)
    np.testing.assert_allclose(result.as_numpy("score")[:, 0], expected["score"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("embedding"), expected["embedding"], rtol=1e-5, atol=1e-6)


def test_a_scalar_input_may_also_come_as_rows_by_one(client: triton.InferenceServerClient) -> None:
    numeric, category = multi_io_inputs(3)
    flat = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category)])
    column = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category[:, None])])
    np.testing.assert_allclose(column.as_numpy("score"), flat.as_numpy("score"), rtol=1e-6)


def test_int64_within_range_is_accepted_for_an_int32_input(client: triton.InferenceServerClient) -> None:
    numeric, category = multi_io_inputs(4)
    wide = client.infer(
        "multi_io", [tensor("numeric", numeric), tensor("category", category.astype(np.int64))]
    )
    native = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category)])
    np.testing.assert_allclose(wide.as_numpy("embedding"), native.as_numpy("embedding"), rtol=1e-6)


def test_int64_beyond_int32_is_refused_naming_the_range(client: triton.InferenceServerClient) -> None:
    numeric, _ = multi_io_inputs(2)
    category = np.array([1, 2**40], dtype=np.int64)
    error = refusal(client, "multi_io", [tensor("numeric", numeric), tensor("category", category)])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'category'" in error.message() and "2147483647" in error.message()
    assert str(2**40) in error.message()


def test_fp64_and_int64_inputs_and_fp64_outputs_of_a_model_declaring_them(
    client: triton.InferenceServerClient,
) -> None:
    numeric, category = multi_io_inputs(5)
    wide = client.infer(
        "multi_io_wide",
        [tensor("numeric", numeric.astype(np.float64)), tensor("category", category.astype(np.int64))],
    )
    native = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category)])
    assert wide.as_numpy("embedding").dtype == np.float64
    np.testing.assert_allclose(wide.as_numpy("embedding"), native.as_numpy("embedding"), rtol=1e-5, atol=1e-6)


def test_bool_input_of_a_model_declaring_it(client: triton.InferenceServerClient) -> None:
    numeric, _ = multi_io_inputs(4)
    flags = np.array([True, False, False, True])
    as_bool = client.infer("multi_io_bool", [tensor("numeric", numeric), tensor("category", flags)])
    as_int = client.infer(
        "multi_io", [tensor("numeric", numeric), tensor("category", flags.astype(np.int32))]
    )
    np.testing.assert_allclose(as_bool.as_numpy("embedding"), as_int.as_numpy("embedding"), rtol=1e-6)


def test_bytes_inference_equals_the_keras_model_in_process(
    client: triton.InferenceServerClient, example_repository: Path
) -> None:
    text = texts(9)
    result = client.infer("text_hashing", [tensor("text", text)])
    expected = keras_reference(example_repository, "text_hashing", {"text": text})["probabilities"]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_bytes_may_also_come_as_rows_by_one(client: triton.InferenceServerClient) -> None:
    text = texts(4)
    as_rows = client.infer("text_hashing", [tensor("text", text)])
    as_rows_by_one = client.infer("text_hashing", [tensor("text", text.reshape(4, 1))])
    np.testing.assert_array_equal(as_rows.as_numpy("probabilities"), as_rows_by_one.as_numpy("probabilities"))


def test_typed_bytes_contents_are_read_like_raw_contents(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    text = texts(3)
    typed = service_pb2.ModelInferRequest(model_name="text_hashing")
    typed.inputs.add(name="text", datatype="BYTES", shape=[3]).contents.bytes_contents.extend(text.tolist())
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(typed, timeout=30)
    raw = client.infer("text_hashing", [tensor("text", text)])
    received = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(received, raw.as_numpy("probabilities"))


def test_typed_contents_fields_are_read_like_raw_contents(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    numeric, category = multi_io_inputs(3)
    typed = service_pb2.ModelInferRequest(model_name="multi_io")
    typed.inputs.add(name="numeric", datatype="FP32", shape=[3, 8]).contents.fp32_contents.extend(
        numeric.reshape(-1).tolist()
    )
    typed.inputs.add(name="category", datatype="INT32", shape=[3]).contents.int_contents.extend(
        category.tolist()
    )
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(typed, timeout=30)
    raw = client.infer("multi_io", [tensor("numeric", numeric), tensor("category", category)])
    embedding = next(i for i, o in enumerate(response.outputs) if o.name == "embedding")
    received = np.frombuffer(response.raw_output_contents[embedding], dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(received, raw.as_numpy("embedding"), rtol=1e-6)


def test_only_the_requested_outputs_are_answered(client: triton.InferenceServerClient) -> None:
    numeric, category = multi_io_inputs(2)
    result = client.infer(
        "multi_io",
        [tensor("numeric", numeric), tensor("category", category)],
        outputs=[triton.InferRequestedOutput("score")],
    )
    assert [o.name for o in result.get_response().outputs] == ["score"]


def test_zero_rows_get_zero_rows_back(client: triton.InferenceServerClient) -> None:
    result = client.infer("tabular_mlp", [tensor("features", np.zeros((0, 64), np.float32))])
    assert result.as_numpy("probabilities").shape == (0, 8)


# -- errors ------------------------------------------------------------------------------------
def test_a_wrong_shape_names_the_input_the_expected_and_the_received_shape(
    client: triton.InferenceServerClient,
) -> None:
    error = refusal(client, "tabular_mlp", [tensor("features", np.zeros((2, 63), np.float32))])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'features'" in error.message() and "[-1, 64]" in error.message() and "[2, 63]" in error.message()


@pytest.mark.parametrize(
    ("datatype", "shape"),
    [("INT8", [3, 6148914691236517206]), ("FP32", [0, 1 << 62]), ("FP32", [1] * 70)],
    ids=["element-count-overflows", "too-big-for-numpy", "70-dimensions"],
)
def test_a_shape_no_array_can_have_is_refused_and_calls_beside_it_are_answered(
    kserve_server: ServerProcess, client: triton.InferenceServerClient, datatype: str, shape: list[int]
) -> None:
    bad = service_pb2.ModelInferRequest(model_name="tabular_mlp")
    bad.inputs.add(name="features", datatype=datatype, shape=shape)
    bad.raw_input_contents.append(b"\0\0")
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(bad, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'features'" in (raised.value.details() or "")
    assert client.infer("tabular_mlp", [tensor("features", features(2))]).as_numpy("probabilities").shape == (
        2,
        8,
    )


def test_a_method_udfserve_does_not_serve_answers_unimplemented(kserve_server: ServerProcess) -> None:
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.TraceSetting(service_pb2.TraceSettingRequest(), timeout=30)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_bool_for_a_float_input_is_refused_naming_both_datatypes(
    client: triton.InferenceServerClient,
) -> None:
    error = refusal(client, "tabular_mlp", [tensor("features", np.zeros((2, 64), bool))])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'features'" in error.message() and "FP32" in error.message() and "BOOL" in error.message()


def test_floats_for_an_integer_input_are_refused_rather_than_truncated(
    client: triton.InferenceServerClient,
) -> None:
    numeric, _ = multi_io_inputs(2)
    error = refusal(
        client, "multi_io", [tensor("numeric", numeric), tensor("category", np.array([1.5, 2.0], np.float32))]
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'category'" in error.message() and "INT32" in error.message() and "FP32" in error.message()


def test_bytes_for_a_numeric_input_are_refused_naming_the_input(client: triton.InferenceServerClient) -> None:
    strings = np.array([[b"0.5"] * 64] * 2, dtype=object)
    error = refusal(client, "tabular_mlp", [tensor("features", strings)])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'features'" in error.message() and "expected datatype FP32, received BYTES" in error.message()


def test_numbers_for_a_string_input_are_refused_naming_both_datatypes(
    client: triton.InferenceServerClient,
) -> None:
    error = refusal(client, "text_hashing", [tensor("text", np.array([1.5, 2.5], np.float32))])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'text'" in error.message() and "expected datatype BYTES, received FP32" in error.message()


def test_raw_bytes_cut_inside_an_element_are_refused_naming_the_input(kserve_server: ServerProcess) -> None:
    cut = service_pb2.ModelInferRequest(model_name="text_hashing")
    cut.inputs.add(name="text", datatype="BYTES", shape=[2])
    cut.raw_input_contents.append(b"\x02\x00\x00\x00ab\x09\x00\x00\x00abc")
    with (
        grpc.insecure_channel(kserve_server.kserve_target()) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(cut, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'text'" in raised.value.details() and "declares 9 bytes" in raised.value.details()


def test_a_missing_input_is_refused_naming_the_expected_inputs(client: triton.InferenceServerClient) -> None:
    numeric, _ = multi_io_inputs(2)
    error = refusal(client, "multi_io", [tensor("numeric", numeric)])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "category" in error.message() and "numeric" in error.message()


def test_an_unknown_model_is_not_found_and_lists_the_served_models(
    client: triton.InferenceServerClient,
) -> None:
    error = refusal(client, "no_such_model", [tensor("features", features(2))])
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in error.message() and "tabular_mlp" in error.message()


def test_an_unknown_version_is_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer("tabular_mlp", [tensor("features", features(2))], model_version="7")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "version 7" in raised.value.message()


def test_a_full_queue_answers_triton_s_unavailable_and_the_rest_is_answered(
    client: triton.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[object, InferenceServerException | None]] = queue.Queue()
    lines = np.random.default_rng(0).normal(size=(SMALL_QUEUE_ROWS, 16, 32)).astype(np.float32)
    for i in range(120):  # unary calls in flight together, as perf_analyzer's contexts send them
        client.async_infer(
            "small_queue",
            [tensor("lines", lines)],
            callback=lambda result, error: answers.put((result, error)),
            request_id=str(i),
        )
    received = [answers.get(timeout=60) for _ in range(120)]
    errors = [error for _, error in received if error is not None]
    assert errors and len(errors) < 120
    assert all(e.message().startswith("Exceeds maximum queue size") for e in errors)
    retried = client.infer("small_queue", [tensor("lines", lines)])
    assert retried.as_numpy("class_probabilities").shape == (SMALL_QUEUE_ROWS, 4)


# -- streaming ---------------------------------------------------------------------------------
@pytest.fixture
def stream_client(kserve_server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    """Streams are served on the main port with either front end."""
    assert kserve_server.tcp_address is not None
    with triton.InferenceServerClient(kserve_server.tcp_address) as triton_client:
        yield triton_client


def test_streaming_answers_every_request_by_id_and_a_bad_one_alone(
    stream_client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    answers: queue.Queue[tuple[object, InferenceServerException | None]] = queue.Queue()
    inputs = {str(i): features(i + 1) for i in range(6)}
    stream_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, x in inputs.items():
            stream_client.async_stream_infer("tabular_mlp", [tensor("features", x)], request_id=request_id)
        stream_client.async_stream_infer("tabular_mlp", [tensor("features", np.zeros((1, 3), np.float32))])
        received = [answers.get(timeout=60) for _ in range(len(inputs) + 1)]
    finally:
        stream_client.stop_stream()
    results = {r.get_response().id: r for r, error in received if error is None}
    errors = [error for _, error in received if error is not None]
    assert sorted(results) == sorted(inputs)
    assert len(errors) == 1 and "[1, 3]" in errors[0].message()
    for request_id, x in inputs.items():
        expected = arrow_answer(kserve_server, "tabular_mlp", {"features": x})["probabilities"]
        np.testing.assert_allclose(
            results[request_id].as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6
        )


def test_the_triton_grpc_error_header_ends_a_stream_with_the_status(kserve_server: ServerProcess) -> None:
    bad = service_pb2.ModelInferRequest(model_name="no_such_model", id="x")
    with grpc.insecure_channel(kserve_server.grpc_target()) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([bad]), metadata=[("triton_grpc_error", "true")], timeout=30
        )
        with pytest.raises(grpc.RpcError) as raised:
            list(stream)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


# -- same server, same metrics -----------------------------------------------------------------
def test_kserve_requests_are_counted_in_the_server_metrics(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    assert kserve_server.http_address is not None
    before = scrape(kserve_server.http_address)
    client.infer("tabular_mlp", [tensor("features", features(7))])
    refusal(client, "tabular_mlp", [tensor("features", np.zeros((1, 3), np.float32))])
    after = scrape(kserve_server.http_address)
    for name, labels, delta in [
        ("udfserve_requests_total", {"model": "tabular_mlp", "code": "OK"}, 1),
        ("udfserve_requests_total", {"model": "tabular_mlp", "code": "INVALID_ARGUMENT"}, 1),
        ("udfserve_rows_total", {"model": "tabular_mlp"}, 7),
    ]:
        assert metric_value(after, name, **labels) - metric_value(before, name, **labels) == delta


# -- statistics (Triton's extension) -------------------------------------------------------------
def statistics_of(client: triton.InferenceServerClient, model: str) -> service_pb2.ModelStatistics:
    (stats,) = client.get_inference_statistics(model).model_stats
    return stats


def test_statistics_count_requests_rows_failures_and_backend_calls(
    client: triton.InferenceServerClient,
) -> None:
    before = statistics_of(client, "tabular_mlp")
    for rows in (5, 6, 7):  # one at a time: each finds the batcher idle and is a call of its own
        client.infer("tabular_mlp", [tensor("features", features(rows))])
    refusal(client, "tabular_mlp", [tensor("features", np.zeros((1, 3), np.float32))])
    after = statistics_of(client, "tabular_mlp")
    assert (after.name, after.version) == ("tabular_mlp", "1")
    assert after.inference_count - before.inference_count == 18
    assert after.execution_count - before.execution_count == 3

    def grown(field: str, part: str) -> int:
        return getattr(getattr(after.inference_stats, field), part) - getattr(
            getattr(before.inference_stats, field), part
        )

    for field, delta in [("success", 3), ("fail", 1), ("queue", 3), ("compute_infer", 3)]:
        assert grown(field, "count") == delta
    assert grown("compute_infer", "ns") > 0
    # what perf_analyzer prints as overhead is never negative
    assert grown("success", "ns") >= grown("queue", "ns") + grown("compute_infer", "ns")
    calls = {stat.batch_size: stat.compute_infer.count for stat in after.batch_stats}
    calls_before = {stat.batch_size: stat.compute_infer.count for stat in before.batch_stats}
    assert {rows: calls[rows] - calls_before.get(rows, 0) for rows in (5, 6, 7)} == {5: 1, 6: 1, 7: 1}
    assert after.last_inference >= before.last_inference and after.last_inference > 0


def test_a_request_for_a_version_not_served_counts_as_a_failure_of_its_model(
    client: triton.InferenceServerClient,
) -> None:
    before = statistics_of(client, "tabular_mlp")
    with pytest.raises(InferenceServerException, match="version 9 is not served"):
        client.infer("tabular_mlp", [tensor("features", features(1))], model_version="9")
    after = statistics_of(client, "tabular_mlp")
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1


def test_statistics_count_arrow_protocol_requests_too(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    before = statistics_of(client, "tabular_mlp")
    arrow_answer(kserve_server, "tabular_mlp", {"features": features(9)})
    after = statistics_of(client, "tabular_mlp")
    assert after.inference_count - before.inference_count == 9
    assert after.inference_stats.success.count - before.inference_stats.success.count == 1


def test_statistics_without_a_name_cover_every_ready_model(client: triton.InferenceServerClient) -> None:
    names = [stats.name for stats in client.get_inference_statistics().model_stats]
    assert names == sorted(
        ["tabular_mlp", "multi_io", "text_hashing", "multi_io_bool", "multi_io_wide", "small_queue"]
    )


def test_statistics_of_an_unknown_model_are_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.get_inference_statistics("no_such_model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in raised.value.message()


def test_statistics_of_a_version_that_is_not_a_number_are_refused(
    client: triton.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.get_inference_statistics("tabular_mlp", "²")
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "not a version number" in raised.value.message()


def test_statistics_of_a_version_without_a_model_name_are_refused(kserve_server: ServerProcess) -> None:
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelStatistics(service_pb2.ModelStatisticsRequest(version="1"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "without a model name" in raised.value.details()


def test_kserve_requests_carrying_spark_metadata_are_counted_for_their_application(
    client: triton.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    """The Spark client sends its job's context as gRPC metadata on KServe calls too."""
    assert kserve_server.http_address is not None
    spark = {"udfserve-spark-app-id": "app-kserve-0001", "udfserve-spark-app-name": "kserve scoring"}
    client.infer("tabular_mlp", [tensor("features", features(5))], headers=spark)
    client.infer("tabular_mlp", [tensor("features", features(6))], headers=spark)
    with pytest.raises(InferenceServerException):
        client.infer("tabular_mlp", [tensor("features", np.zeros((1, 3), np.float32))], headers=spark)

    status, body = http_json(kserve_server.http_address, "/v1/spark/applications")
    assert status == 200
    [app] = [a for a in body["applications"] if a["app_id"] == "app-kserve-0001"]
    assert (app["app_name"], app["rows"], app["requests"], app["errors"]) == ("kserve scoring", 11, 3, 1)
    labels = {"app_id": "app-kserve-0001", "app_name": "kserve scoring"}
    assert metric_value(scrape(kserve_server.http_address), "udfserve_app_rows_total", **labels) == 11


# -- the shared codec against the real server --------------------------------------------------
@pytest.mark.parametrize("model", ["tabular_mlp", "multi_io", "text_hashing"])
def test_the_codec_gives_the_same_arrow_batch_as_the_arrow_protocol(
    client: triton.InferenceServerClient, kserve_server: ServerProcess, model: str
) -> None:
    if model == "tabular_mlp":
        inputs = {"features": features(4)}
    elif model == "text_hashing":
        inputs = {"text": texts(4)}
    else:
        numeric, category = multi_io_inputs(4)
        inputs = {"numeric": numeric.astype(np.float64), "category": category.astype(np.int64)}
    input_specs, output_specs = specs_from_config(client.get_model_config(model).config)
    request_message = arrow_batch_to_infer_request(batch_of(inputs), model, 1, "b7", input_specs=input_specs)
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_message, timeout=30)
    via_kserve = infer_response_to_arrow(response, output_specs)
    via_arrow = stream_predict(kserve_server.grpc_target(), [request(model, batch_of(inputs))])[0].outputs
    assert via_arrow is not None and response.id == "b7"
    assert via_kserve.schema.equals(via_arrow.schema)
    for name in via_arrow.schema.names:
        np.testing.assert_allclose(
            column_to_numpy(via_kserve.column(name)),
            column_to_numpy(via_arrow.column(name)),
            rtol=1e-5,
            atol=1e-6,
        )


def test_the_codec_sends_a_spark_string_column_as_bytes(
    client: triton.InferenceServerClient, kserve_server: ServerProcess, example_repository: Path
) -> None:
    text = ["héllo", "", "spark"]
    input_specs, output_specs = specs_from_config(client.get_model_config("text_hashing").config)
    batch = pa.record_batch({"text": pa.array(text, pa.string())})
    request_message = arrow_batch_to_infer_request(batch, "text_hashing", input_specs=input_specs)
    assert [t.datatype for t in request_message.inputs] == ["BYTES"]
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_message, timeout=30)
    answer = infer_response_to_arrow(response, output_specs)
    expected = keras_reference(
        example_repository, "text_hashing", {"text": np.array([t.encode() for t in text], dtype=object)}
    )
    np.testing.assert_allclose(
        column_to_numpy(answer.column("probabilities")), expected["probabilities"], rtol=1e-5, atol=1e-6
    )


# -- hostile input: honest statuses --------------------------------------------------------------
INT32 = np.iinfo(np.int32)
LONG_VERSION = "9" * 5_000
"""More digits than Python's int() reads (4,300): once answered INTERNAL or UNKNOWN."""


def version_calls(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> dict[str, object]:
    return {
        "ModelReady": lambda: stub.ModelReady(
            service_pb2.ModelReadyRequest(name="tabular_mlp", version=LONG_VERSION), timeout=30
        ),
        "ModelMetadata": lambda: stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name="tabular_mlp", version=LONG_VERSION), timeout=30
        ),
        "ModelConfig": lambda: stub.ModelConfig(
            service_pb2.ModelConfigRequest(name="tabular_mlp", version=LONG_VERSION), timeout=30
        ),
        "ModelStatistics": lambda: stub.ModelStatistics(
            service_pb2.ModelStatisticsRequest(name="tabular_mlp", version=LONG_VERSION), timeout=30
        ),
        "ModelInfer": lambda: stub.ModelInfer(
            arrow_batch_to_infer_request(batch_of({"features": features(2)}), "tabular_mlp", LONG_VERSION),
            timeout=30,
        ),
    }


@pytest.mark.parametrize(
    "rpc", ["ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics", "ModelInfer"]
)
def test_a_model_version_of_thousands_of_digits_is_invalid_naming_the_field(
    kserve_server: ServerProcess, rpc: str
) -> None:
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        call = version_calls(service_pb2_grpc.GRPCInferenceServiceStub(channel))[rpc]
        with pytest.raises(grpc.RpcError) as raised:
            call()  # type: ignore[operator]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    assert "model_version" in details and "5000 characters" in details and len(details) < 400


def test_a_streamed_model_version_of_thousands_of_digits_is_invalid_naming_the_field(
    kserve_server: ServerProcess,
) -> None:
    message = arrow_batch_to_infer_request(
        batch_of({"features": features(2)}), "tabular_mlp", LONG_VERSION, request_id="long"
    )
    with grpc.insecure_channel(kserve_server.grpc_target()) as channel:
        answers = list(
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([message]), timeout=30)
        )
    assert len(answers) == 1 and "model_version" in answers[0].error_message


@pytest.mark.parametrize(
    ("datatype", "field", "value", "bounds"),
    [
        ("INT8", "int_contents", 1000, "[-128, 127]"),
        ("UINT8", "uint_contents", 300, "[0, 255]"),
        ("INT16", "int_contents", 100000, "[-32768, 32767]"),
        ("UINT16", "uint_contents", 70000, "[0, 65535]"),
    ],
)
def test_typed_contents_outside_their_datatype_are_invalid_naming_the_tensor_the_datatype_and_the_range(
    kserve_server: ServerProcess, datatype: str, field: str, value: int, bounds: str
) -> None:
    message = service_pb2.ModelInferRequest(model_name="multi_io")
    numeric = message.inputs.add(name="numeric", datatype="FP32", shape=[1, 8])
    numeric.contents.fp32_contents.extend([0.0] * 8)
    category = message.inputs.add(name="category", datatype=datatype, shape=[1])
    getattr(category.contents, field).append(value)
    with (
        grpc.insecure_channel(kserve_server.kserve_target()) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    assert "'category'" in details and datatype in details and bounds in details


UNPARSEABLE = b"\x0a\x05ab"
"""Field 1 declares 5 bytes and 2 follow: no message of any type parses from it."""


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ModelReady", "ModelStatistics"])
def test_a_message_that_does_not_parse_is_invalid_argument(kserve_server: ServerProcess, method: str) -> None:
    with grpc.insecure_channel(kserve_server.kserve_target()) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as raised:
            call(UNPARSEABLE, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"cannot be parsed as inference.{method}Request" in (raised.value.details() or "")


def test_a_streamed_message_that_does_not_parse_ends_the_stream_invalid_after_the_answers_before_it(
    kserve_server: ServerProcess,
) -> None:
    good = arrow_batch_to_infer_request(batch_of({"features": features(2)}), "tabular_mlp", request_id="good")
    with grpc.insecure_channel(kserve_server.grpc_target()) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )(iter([good.SerializeToString(), UNPARSEABLE]), timeout=30)
        answers = []
        with pytest.raises(grpc.RpcError) as raised:
            answers.extend(stream)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [answer.infer_response.id for answer in answers] == ["good"]


@pytest.mark.parametrize("category", [16, 99, 1000, INT32.max, INT32.min, -1])
def test_an_id_beyond_the_embedding_table_is_invalid_naming_the_input_and_the_row(
    client: triton.InferenceServerClient, category: int
) -> None:
    numeric, categories = multi_io_inputs(3)
    categories[1] = category
    error = refusal(client, "multi_io", [tensor("numeric", numeric), tensor("category", categories)])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    message = error.message()
    assert "'category'" in message and "row 1" in message and "[0, 15]" in message
    assert "File " not in message and "Traceback" not in message


@pytest.mark.parametrize("where", ["output", "input"])
def test_a_refusal_quoting_a_64_kib_name_keeps_its_status(kserve_server: ServerProcess, where: str) -> None:
    """The message is cut: whole, it would exceed the 16 KiB of trailers a client accepts, and
    reach it as RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT."""
    message = arrow_batch_to_infer_request(batch_of({"features": features(2)}), "tabular_mlp")
    if where == "output":
        message.outputs.add(name="o" * (64 << 10))
    else:
        message.inputs[0].name = "i" * (64 << 10)
    with (
        grpc.insecure_channel(kserve_server.kserve_target()) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    assert details.startswith("model 'tabular_mlp': ") and details.endswith(" characters)")
    assert len(details) < 2000
