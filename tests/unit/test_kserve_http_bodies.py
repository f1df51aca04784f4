"""KServe v2 HTTP bodies: a request read as the gRPC ModelInferRequest, an answer written as JSON or
binary tensor data, the way tritonclient's HTTP client writes and reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.http import InferInput, InferRequestedOutput
from tritonclient.http._infer_result import InferResult
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import serialize_byte_tensor

from udfserve import kserve_tensors as codec
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.kserve.answers import TensorAnswer
from udfserve.services.model_server.frontends.kserve_http.answer_bodies import answer_body, texts_of
from udfserve.services.model_server.frontends.kserve_http.bodies import OutputFormat, read_request


def tritonclient_body(
    inputs: list[InferInput], outputs: list[InferRequestedOutput] | None = None, request_id: str = ""
) -> tuple[bytes, str | None]:
    """The body and Inference-Header-Content-Length tritonclient.http sends for these tensors."""
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id=request_id,
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )
    return body, None if json_size is None else str(json_size)


def infer_input(name: str, values: np.ndarray, datatype: str, binary: bool) -> InferInput:
    tensor = InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def read(body: bytes | str, header: str | None = None, model: str = "m", version: str = "") -> object:
    raw = body.encode() if isinstance(body, str) else body
    return read_request(raw, header, model, version)


def refusal(body: bytes | str, header: str | None = None) -> str:
    with pytest.raises(InvalidInput) as raised:
        read(body, header).message()  # type: ignore[attr-defined]
    return raised.value.message


# -- requests --------------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False])
def test_numbers_from_json_or_binary_become_the_raw_contents_of_the_grpc_request(binary: bool) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    body, header = tritonclient_body([infer_input("x", x, "FP32", binary)], request_id="r7")
    message = read_request(body, header, "m", "2").message()
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "r7")
    assert [(t.name, t.datatype, list(t.shape)) for t in message.inputs] == [("x", "FP32", [3, 4])]
    np.testing.assert_array_equal(np.frombuffer(message.raw_input_contents[0], np.float32).reshape(3, 4), x)


def test_nested_json_data_reads_as_the_flat_list_does() -> None:
    tensor = {"name": "x", "shape": [2, 2], "datatype": "INT32"}
    nested = read(json.dumps({"inputs": [{**tensor, "data": [[1, 2], [3, 4]]}]})).message()  # type: ignore[attr-defined]
    flat = read(json.dumps({"inputs": [{**tensor, "data": [1, 2, 3, 4]}]})).message()  # type: ignore[attr-defined]
    assert (
        nested.raw_input_contents[0]
        == flat.raw_input_contents[0]
        == np.arange(1, 5, dtype=np.int32).tobytes()
    )


def test_binary_inputs_are_taken_from_the_bytes_after_the_json_in_the_order_of_the_inputs() -> None:
    a = np.arange(4, dtype=np.int64).reshape(2, 2)
    b = np.array([True, False])
    c = np.array([[0.5], [1.5]], dtype=np.float64)
    body, header = tritonclient_body(
        [
            infer_input("a", a, "INT64", True),
            infer_input("b", b, "BOOL", False),
            infer_input("c", c, "FP64", True),
        ]
    )
    message = read_request(body, header, "m", "").message()
    assert message.raw_input_contents[0] == a.tobytes()
    assert message.raw_input_contents[1] == b.tobytes()
    assert message.raw_input_contents[2] == c.tobytes()


def test_every_input_binary_in_a_fixed_size_datatype_is_offered_as_arrays_over_the_body() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    body, header = tritonclient_body([infer_input("x", x, "FP32", True)])
    decoded = read_request(body, header, "m", "").decoded
    assert decoded is not None
    ((name, datatype, shape, array),) = decoded
    assert (name, datatype, shape) == ("x", "FP32", (3, 2))
    np.testing.assert_array_equal(array, x)


@pytest.mark.parametrize(
    "inputs",
    [
        [("x", np.zeros((2, 2), np.float32), "FP32", False)],
        [("t", np.array([b"a", b"b"], dtype=object), "BYTES", True)],
    ],
    ids=["json", "bytes"],
)
def test_json_or_bytes_inputs_take_the_message_s_checks(
    inputs: list[tuple[str, np.ndarray, str, bool]],
) -> None:
    body, header = tritonclient_body([infer_input(*spec) for spec in inputs])
    assert read_request(body, header, "m", "").decoded is None


def test_a_shape_numpy_cannot_hold_takes_the_message_s_checks() -> None:
    shape = [1] * 70  # numpy holds 64 dimensions at most
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": 4}}]}
    )
    read = read_request(head.encode() + bytes(4), str(len(head)), "m", "")
    assert read.decoded is None
    assert list(read.message().inputs[0].shape) == shape


def test_bytes_from_json_strings_are_their_utf8_length_prefixed_as_triton_encodes_them() -> None:
    texts = np.array(["héllo".encode(), b"spark"], dtype=object)
    body, header = tritonclient_body([infer_input("t", texts, "BYTES", False)])
    message = read_request(body, header, "m", "").message()
    assert message.raw_input_contents[0] == serialize_byte_tensor(texts).item()


def test_binary_bytes_are_passed_as_sent() -> None:
    raw = np.array([b"\xff\x00", b""], dtype=object)
    body, header = tritonclient_body([infer_input("t", raw, "BYTES", True)])
    message = read_request(body, header, "m", "").message()
    np.testing.assert_array_equal(codec.deserialize_bytes(message.raw_input_contents[0], 2, "t"), raw)


def test_output_parameters_other_than_binary_data_reach_the_grpc_request() -> None:
    body, header = tritonclient_body(
        [infer_input("x", np.zeros((1, 1), np.float32), "FP32", True)],
        [InferRequestedOutput("y", binary_data=True, class_count=3)],
    )
    (output,) = read_request(body, header, "m", "").message().outputs
    assert output.name == "y"
    assert dict(output.parameters)["classification"].int64_param == 3
    assert "binary_data" not in output.parameters


@pytest.mark.parametrize(
    ("body", "header", "expected"),
    [
        ("{not json", None, "is not JSON"),
        ("[1, 2]", None, "expected an object with 'inputs'"),
        ('{"inputs": {}}', None, "expected a list of tensors"),
        ('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}', None, "neither 'data' nor"),
        (
            '{"inputs": [{"name": "x", "datatype": "FP32", "shape": ["2"], "data": [1]}]}',
            None,
            "list of integers",
        ),
        ('{"inputs": []}', "99", "within the body's"),
        ('{"id": 7, "inputs": []}', None, "'id' is int; expected a string"),
    ],
)
def test_a_body_that_is_not_an_inference_request_names_what_is_wrong(
    body: str, header: str | None, expected: str
) -> None:
    assert expected in refusal(body, header)


def test_binary_data_beyond_the_body_is_refused_naming_the_input() -> None:
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
    )
    message = refusal(head + "abcd", str(len(head)))
    assert "'x'" in message and "binary_data_size 8 reaches beyond the 4 bytes" in message


def test_bytes_left_after_the_declared_binary_data_are_refused() -> None:
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}
    )
    assert "holds 2 bytes beyond the JSON" in refusal(head + "abcdef", str(len(head)))


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("INT32", [1.5, 2.0], "expected datatype INT32 (accepting integer values), received FP64"),
        ("INT8", [1, 300], "expected INT8 values in [-128, 127]"),
        ("FP32", [1.0, "a"], "not a list of numbers"),
        ("FP32", [[1.0], [2.0, 3.0]], "not a list of numbers"),
        ("FP32", [1.0, 2.0, 3.0], "shape [2] holds 2 elements, 'data' has 3"),
        ("BOOL", [1, 0], "expected datatype BOOL (accepting BOOL values)"),
        ("BYTES", ["a", 2], "'data' holds a int; expected strings"),
        ("BF16", [1.0, 2.0], "datatype 'BF16' is not supported"),
    ],
)
def test_json_data_that_is_not_of_its_datatype_and_shape_is_refused_naming_the_input(
    datatype: str, data: list[object], expected: str
) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": data}]})
    message = refusal(body)
    assert "input 'x'" in message and expected in message


def test_an_input_naming_a_shared_memory_region_goes_to_the_request_as_its_parameters() -> None:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8},
                }
            ]
        }
    )
    read_body = read(body)
    assert read_body.decoded is None  # type: ignore[attr-defined]
    message = read_body.message()  # type: ignore[attr-defined]
    parameters = message.inputs[0].parameters
    assert parameters["shared_memory_region"].string_param == "r"
    assert parameters["shared_memory_byte_size"].int64_param == 8
    assert list(message.raw_input_contents) == []


def test_an_input_naming_a_shared_memory_region_and_carrying_data_is_refused() -> None:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "data": [1.0, 2.0],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8},
                }
            ]
        }
    )
    assert "names a shared-memory region and carries data; expected one" in refusal(body)


# -- answers ---------------------------------------------------------------------------------
def tensor_answer() -> TensorAnswer:
    probabilities = np.array([[0.25, 0.75], [0.5, 0.5]], dtype=np.float32)
    labels = np.array([b"cat", "chat n°1".encode()], dtype=object)
    return TensorAnswer(
        "m",
        "1",
        "r1",
        [
            ("probabilities", "FP32", [2, 2], probabilities),
            ("label", "BYTES", [2, 1], codec.serialize_bytes(labels)),
        ],
    )


def as_tritonclient_reads_it(body: bytes, json_length: int | None) -> InferResult:
    return InferResult.from_response_body(body, header_length=json_length)


@pytest.mark.parametrize("binary", [True, False])
def test_an_answer_reads_back_in_tritonclient_as_the_model_s_outputs(binary: bool) -> None:
    answer = tensor_answer()
    form = OutputFormat(binary_default=binary)
    body, json_length = answer_body(answer, form, texts_of(answer, form))
    assert (json_length is not None) == binary
    result = as_tritonclient_reads_it(body, json_length)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), [[0.25, 0.75], [0.5, 0.5]])
    labels = [b"cat", "chat n°1".encode()] if binary else ["cat", "chat n°1"]  # JSON carries text
    np.testing.assert_array_equal(result.as_numpy("label").reshape(-1), labels)
    assert result.get_response()["id"] == "r1"
    assert result.get_response()["model_version"] == "1"


def test_an_output_named_binary_false_is_json_while_the_others_are_binary() -> None:
    answer = tensor_answer()
    form = OutputFormat(binary_default=True, binary_of={"label": False})
    body, json_length = answer_body(answer, form, texts_of(answer, form))
    assert json_length is not None
    head = json.loads(body[:json_length])
    outputs = {output["name"]: output for output in head["outputs"]}
    assert outputs["label"]["data"] == ["cat", "chat n°1"]
    assert outputs["probabilities"]["parameters"] == {"binary_data_size": 16}
    assert len(body) == json_length + 16


def test_bytes_that_are_not_utf8_are_refused_in_json_naming_the_output_and_the_binary_form() -> None:
    answer = TensorAnswer(
        "m", "1", "", [("raw", "BYTES", [1, 1], codec.serialize_bytes(np.array([b"\xff"], object)))]
    )
    with pytest.raises(InvalidInput) as raised:
        texts_of(answer, OutputFormat())
    assert "output 'raw'" in raised.value.message and "binary_data: true" in raised.value.message
    assert texts_of(answer, OutputFormat(binary_default=True)) == {}
