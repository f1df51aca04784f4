"""Arrow batches to KServe v2 requests and responses back to Arrow, without a server."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from udfserve.kserve_tensors import (
    KServeCodecError,
    TensorSpec,
    coerce,
    tensor_from_contents,
    tensor_from_raw,
    tensor_to_raw,
)
from udfserve.spark_client.wire.kserve_messages import (
    arrow_batch_to_infer_request,
    infer_response_to_arrow,
    specs_from_config,
    specs_from_metadata,
)


def fixed_lists(values: np.ndarray) -> pa.Array:
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def decoded_inputs(request: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    return {
        t.name: tensor_from_raw(raw, t.datatype, t.shape, t.name)
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


def response_of(outputs: dict[str, np.ndarray], model: str = "m") -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=model, model_version="1", id="r")
    for name, array in outputs.items():
        datatype = {
            "float32": "FP32",
            "float64": "FP64",
            "int32": "INT32",
            "bool": "BOOL",
            "object": "BYTES",
        }[array.dtype.name]
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(tensor_to_raw(array))
    return response


# -- requests ----------------------------------------------------------------------------------
def test_a_fixed_size_list_column_becomes_a_rows_by_width_fp32_tensor() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    request = arrow_batch_to_infer_request(pa.record_batch({"x": fixed_lists(x)}), "m", 1, "id-1")
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "id-1")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("x", "FP32", [3, 4])]
    np.testing.assert_array_equal(decoded_inputs(request)["x"], x)


def test_variable_lists_of_one_length_become_a_tensor() -> None:
    column = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], type=pa.list_(pa.float64()))
    request = arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")
    assert list(request.inputs[0].shape) == [3, 2] and request.inputs[0].datatype == "FP64"
    np.testing.assert_array_equal(decoded_inputs(request)["x"], [[1, 2], [3, 4], [5, 6]])


def test_a_sliced_list_column_sends_only_its_own_rows() -> None:
    column = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], type=pa.large_list(pa.float32())).slice(1, 2)
    request = arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")
    np.testing.assert_array_equal(decoded_inputs(request)["x"], [[3, 4], [5, 6]])


def test_ragged_lists_are_refused_naming_the_column_and_the_row() -> None:
    column = pa.array([[1.0, 2.0], [3.0], [5.0, 6.0]])
    with pytest.raises(KServeCodecError, match=r"'x'.*row 0 has length 2, received length 1 in row 1"):
        arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")


def test_a_null_row_is_refused_naming_the_row() -> None:
    column = pa.array([[1.0], None, [2.0]])
    with pytest.raises(KServeCodecError, match=r"'x'.*null row 1"):
        arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")


def test_a_null_value_inside_a_row_is_refused_naming_the_row() -> None:
    column = pa.array([[1.0, 2.0], [3.0, None]])
    with pytest.raises(KServeCodecError, match=r"'x'.*null value inside row 1"):
        arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")


def test_a_struct_column_is_refused_naming_its_type() -> None:
    column = pa.array([{"a": 1}], pa.struct([("a", pa.int64())]))
    with pytest.raises(KServeCodecError, match=r"'x'.*numeric, boolean or string.*struct"):
        arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")


# -- strings (BYTES) ---------------------------------------------------------------------------
def test_a_string_column_becomes_a_bytes_tensor_encoded_as_tritonclient_encodes_it() -> None:
    texts = ["héllo", "", "spark"]
    request = arrow_batch_to_infer_request(pa.record_batch({"text": pa.array(texts)}), "m")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("text", "BYTES", [3])]
    expected = serialize_byte_tensor(np.array([t.encode() for t in texts], dtype=object)).item()
    assert request.raw_input_contents[0] == expected


@pytest.mark.parametrize(
    "column_type", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()], ids=str
)
def test_string_and_binary_columns_of_every_width_become_bytes(column_type: pa.DataType) -> None:
    values = pa.array(["a", "bc"]).cast(column_type)
    request = arrow_batch_to_infer_request(pa.record_batch({"x": values}), "m")
    assert request.inputs[0].datatype == "BYTES"
    assert decoded_inputs(request)["x"].tolist() == [b"a", b"bc"]


def test_a_column_of_string_lists_becomes_a_rows_by_width_bytes_tensor() -> None:
    column = pa.array([["a", "b"], ["c", "d"], ["e", "f"]])
    request = arrow_batch_to_infer_request(pa.record_batch({"x": column}), "m")
    assert list(request.inputs[0].shape) == [3, 2]
    assert decoded_inputs(request)["x"].tolist() == [[b"a", b"b"], [b"c", b"d"], [b"e", b"f"]]


def test_a_null_string_is_refused_naming_the_row() -> None:
    with pytest.raises(KServeCodecError, match=r"'x'.*null row 1"):
        arrow_batch_to_infer_request(pa.record_batch({"x": pa.array(["a", None])}), "m")


def test_raw_bytes_from_tritonclient_decode_to_the_same_values() -> None:
    values = np.array([[b"ab", "né".encode()], [b"", b"\x00\xff"]], dtype=object)
    raw = serialize_byte_tensor(values).item()
    decoded = tensor_from_raw(raw, "BYTES", [2, 2], "x")
    assert decoded.dtype == object and decoded.tolist() == values.tolist()


def test_raw_bytes_encode_as_tritonclient_decodes_them() -> None:
    values = np.array([b"ab", "né", b""], dtype=object)
    assert deserialize_bytes_tensor(tensor_to_raw(values)).tolist() == [b"ab", "né".encode(), b""]


def test_raw_bytes_cut_inside_an_element_are_refused_naming_it() -> None:
    raw = serialize_byte_tensor(np.array([b"ab", b"cdef"], dtype=object)).item()[:-1]
    with pytest.raises(KServeCodecError, match=r"element 1 .* declares 4 bytes, but only 3 bytes are left"):
        tensor_from_raw(raw, "BYTES", [2], "x")


def test_raw_bytes_with_fewer_elements_than_the_shape_are_refused() -> None:
    raw = serialize_byte_tensor(np.array([b"abcdefgh"], dtype=object)).item()
    with pytest.raises(KServeCodecError, match=r"end after 1 of 3 elements"):
        tensor_from_raw(raw, "BYTES", [3], "x")


def test_a_bytes_shape_too_large_for_the_raw_contents_is_refused_before_allocating() -> None:
    with pytest.raises(
        KServeCodecError, match=r"1000000000000 BYTES elements need at least 4000000000000 bytes"
    ):
        tensor_from_raw(b"\x00" * 8, "BYTES", [1_000_000, 1_000_000], "x")


def test_raw_bytes_beyond_the_shape_are_refused() -> None:
    raw = serialize_byte_tensor(np.array([b"ab", b"c"], dtype=object)).item()
    with pytest.raises(KServeCodecError, match=r"5 bytes beyond the 1 elements"):
        tensor_from_raw(raw, "BYTES", [1], "x")


def test_typed_bytes_contents_decode_to_the_declared_shape() -> None:
    contents = service_pb2.InferTensorContents(bytes_contents=[b"a", b"b", b"c", b"d"])
    decoded = tensor_from_contents(contents, "BYTES", [2, 2], "x")
    assert decoded.tolist() == [[b"a", b"b"], [b"c", b"d"]]


def test_a_bytes_tensor_of_non_strings_is_refused_naming_the_element_type() -> None:
    with pytest.raises(KServeCodecError, match=r"expected bytes or str elements.*received int"):
        tensor_to_raw(np.array([b"a", 3], dtype=object))


def test_coerce_refuses_bytes_for_a_number_and_numbers_for_bytes() -> None:
    with pytest.raises(KServeCodecError, match=r"expected datatype FP32 .* received BYTES"):
        coerce(np.array([b"1.5"], dtype=object), "FP32", "x")
    with pytest.raises(KServeCodecError, match=r"expected datatype BYTES .* received INT64"):
        coerce(np.array([1], dtype=np.int64), "BYTES", "x")


def test_specs_send_a_string_column_for_a_bytes_input_and_refuse_numbers() -> None:
    specs = [TensorSpec("text", "BYTES", ())]
    request = arrow_batch_to_infer_request(pa.record_batch({"text": pa.array(["a"])}), "m", input_specs=specs)
    assert request.inputs[0].datatype == "BYTES"
    with pytest.raises(KServeCodecError, match=r"'text'.*expected datatype BYTES .* received INT64"):
        arrow_batch_to_infer_request(pa.record_batch({"text": pa.array([1])}), "m", input_specs=specs)


def test_primitive_columns_become_one_value_per_row_of_their_own_datatype() -> None:
    batch = pa.record_batch(
        {
            "i": pa.array([1, 2], pa.int32()),
            "l": pa.array([3, 4], pa.int64()),
            "b": pa.array([True, False]),
        }
    )
    request = arrow_batch_to_infer_request(batch, "m")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("i", "INT32", [2]),
        ("l", "INT64", [2]),
        ("b", "BOOL", [2]),
    ]
    assert request.raw_input_contents[2] == b"\x01\x00"


def test_specs_coerce_float64_to_fp32_and_int64_to_int32() -> None:
    batch = pa.record_batch(
        {"x": fixed_lists(np.ones((2, 3), np.float64)), "c": pa.array([1, 2], pa.int64())}
    )
    specs = [TensorSpec("x", "FP32", (3,)), TensorSpec("c", "INT32", ())]
    request = arrow_batch_to_infer_request(batch, "m", input_specs=specs)
    assert [(t.datatype, list(t.shape)) for t in request.inputs] == [("FP32", [2, 3]), ("INT32", [2])]


def test_specs_reshape_a_flat_row_to_the_declared_matrix() -> None:
    x = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    request = arrow_batch_to_infer_request(
        pa.record_batch({"x": fixed_lists(x)}), "m", input_specs=[TensorSpec("x", "FP32", (2, 3))]
    )
    np.testing.assert_array_equal(decoded_inputs(request)["x"], x.reshape(2, 2, 3))


def test_specs_turn_a_primitive_column_into_rows_by_one() -> None:
    batch = pa.record_batch({"c": pa.array([7, 8], pa.int32())})
    request = arrow_batch_to_infer_request(batch, "m", input_specs=[TensorSpec("c", "INT32", (1,))])
    assert list(request.inputs[0].shape) == [2, 1]


def test_specs_refuse_a_wrong_width_naming_expected_and_received() -> None:
    batch = pa.record_batch({"x": fixed_lists(np.ones((2, 5), np.float32))})
    with pytest.raises(
        KServeCodecError, match=r"'x'.*expected per-row shape \[4\].*received per-row shape \[5\]"
    ):
        arrow_batch_to_infer_request(batch, "m", input_specs=[TensorSpec("x", "FP32", (4,))])


def test_specs_refuse_missing_or_extra_columns() -> None:
    batch = pa.record_batch({"x": pa.array([1.0]), "row_id": pa.array([1])})
    with pytest.raises(KServeCodecError, match=r"expected exactly the input columns \['x'\].*'row_id'"):
        arrow_batch_to_infer_request(batch, "m", input_specs=[TensorSpec("x", "FP32", ())])


def test_an_empty_variable_list_column_takes_the_declared_width() -> None:
    batch = pa.record_batch({"x": pa.array([], type=pa.list_(pa.float32()))})
    request = arrow_batch_to_infer_request(batch, "m", input_specs=[TensorSpec("x", "FP32", (4,))])
    assert list(request.inputs[0].shape) == [0, 4] and request.raw_input_contents[0] == b""


# -- coercion rules ----------------------------------------------------------------------------
def test_coerce_narrows_fp64_beyond_the_fp32_range_to_infinity() -> None:
    result = coerce(np.array([1e300, -1e300, 0.5]), "FP32", "x")
    assert result.dtype == np.float32
    assert np.isposinf(result[0]) and np.isneginf(result[1]) and result[2] == 0.5


def test_coerce_accepts_integers_for_a_float_datatype() -> None:
    assert coerce(np.array([1, 2], np.int64), "FP32", "x").dtype == np.float32


def test_coerce_refuses_int64_beyond_int32_naming_the_ranges() -> None:
    with pytest.raises(KServeCodecError, match=r"'c'.*\[-2147483648, 2147483647\].*\[0, 4294967296\]"):
        coerce(np.array([0, 2**32], np.int64), "INT32", "input 'c'")


def test_coerce_refuses_floats_for_an_integer_datatype() -> None:
    with pytest.raises(
        KServeCodecError, match=r"expected datatype INT32 \(accepting integer values\), received FP64"
    ):
        coerce(np.array([1.0]), "INT32", "x")


@pytest.mark.parametrize(
    ("values", "datatype"), [(np.array([True]), "FP32"), (np.array([1], np.int32), "BOOL")]
)
def test_coerce_takes_bool_only_to_bool(values: np.ndarray, datatype: str) -> None:
    with pytest.raises(KServeCodecError, match=f"expected datatype {datatype}"):
        coerce(values, datatype, "x")


def test_coerce_keeps_bool_for_bool() -> None:
    values = np.array([True, False])
    assert coerce(values, "BOOL", "x") is values


# -- tensors -----------------------------------------------------------------------------------
def test_raw_contents_of_the_wrong_length_are_refused_naming_both_sizes() -> None:
    with pytest.raises(KServeCodecError, match=r"'x'.*\[2, 3\] of FP32 needs 24 bytes.*received 20 bytes"):
        tensor_from_raw(b"\x00" * 20, "FP32", [2, 3], "input 'x'")


def test_typed_contents_decode_to_the_declared_shape() -> None:
    contents = service_pb2.InferTensorContents(int64_contents=[1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(
        tensor_from_contents(contents, "INT64", [3, 2], "x"), [[1, 2], [3, 4], [5, 6]]
    )


def test_typed_contents_of_the_wrong_count_are_refused() -> None:
    contents = service_pb2.InferTensorContents(fp32_contents=[1.0, 2.0])
    with pytest.raises(KServeCodecError, match=r"needs 3 values in contents.fp32_contents, received 2"):
        tensor_from_contents(contents, "FP32", [3], "x")


def test_unknown_datatypes_are_refused_by_name() -> None:
    with pytest.raises(KServeCodecError, match="'BF16' is not supported"):
        tensor_from_raw(b"", "BF16", [0], "x")
    with pytest.raises(KServeCodecError, match="'FP8' is not supported"):
        tensor_from_raw(b"", "FP8", [0], "x")


# -- responses ---------------------------------------------------------------------------------
def test_a_response_becomes_the_columns_of_the_arrow_protocol_in_spec_order() -> None:
    embedding = np.arange(8, dtype=np.float32).reshape(2, 4)
    score = np.array([[0.25], [0.75]], np.float32)  # a per-row scalar as Triton sends it
    response = response_of({"embedding": embedding, "score": score})
    batch = infer_response_to_arrow(
        response, [TensorSpec("score", "FP32", ()), TensorSpec("embedding", "FP32", (4,))]
    )
    assert batch.schema.names == ["score", "embedding"]
    assert batch.column("score").type == pa.float32()
    assert batch.column("embedding").type == pa.list_(pa.float32(), 4)
    assert batch.column("score").to_pylist() == [0.25, 0.75]
    assert batch.column("embedding").to_pylist() == embedding.tolist()


def test_a_matrix_output_becomes_nested_fixed_size_lists() -> None:
    values = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    batch = infer_response_to_arrow(response_of({"y": values}), [TensorSpec("y", "FP32", (3, 2))])
    assert batch.column("y").type == pa.list_(pa.list_(pa.float32(), 2), 3)
    assert batch.column("y").to_pylist() == values.tolist()


def test_a_bytes_output_becomes_a_binary_column() -> None:
    response = response_of({"label": np.array([[b"cat"], [b"dog"]], dtype=object)})
    batch = infer_response_to_arrow(response, [TensorSpec("label", "BYTES", ())])
    assert batch.column(0).type == pa.binary()
    assert batch.column(0).to_pylist() == [b"cat", b"dog"]


def test_typed_output_contents_are_read_too() -> None:
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="y", datatype="FP64", shape=[2]).contents.fp64_contents.extend([1.5, 2.5])
    batch = infer_response_to_arrow(response, [TensorSpec("y", "FP64", ())])
    assert batch.column("y").to_pylist() == [1.5, 2.5]


def test_a_missing_output_is_refused_naming_expected_and_received() -> None:
    response = response_of({"y": np.zeros((1, 2), np.float32)})
    with pytest.raises(KServeCodecError, match=r"'z'.*missing.*expected outputs \['z'\], received \['y'\]"):
        infer_response_to_arrow(response, [TensorSpec("z", "FP32", (2,))])


def test_outputs_of_different_row_counts_are_refused() -> None:
    response = response_of({"a": np.zeros((2, 1), np.float32), "b": np.zeros((3, 1), np.float32)})
    with pytest.raises(KServeCodecError, match=r"'b'.*3 rows but output 'a' has 2"):
        infer_response_to_arrow(response, [TensorSpec("a", "FP32", ()), TensorSpec("b", "FP32", ())])


def test_round_trip_through_a_request_and_a_response_keeps_the_values() -> None:
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    request = arrow_batch_to_infer_request(pa.record_batch({"x": fixed_lists(x)}), "m")
    batch = infer_response_to_arrow(response_of(decoded_inputs(request)), [TensorSpec("x", "FP32", (3,))])
    np.testing.assert_array_equal(np.stack(batch.column("x").to_numpy(zero_copy_only=False)), x)


# -- metadata ----------------------------------------------------------------------------------
def test_specs_from_metadata_drop_the_batch_dimension() -> None:
    metadata = service_pb2.ModelMetadataResponse(name="m")
    metadata.inputs.add(name="x", datatype="FP32", shape=[-1, 64])
    metadata.outputs.add(name="y", datatype="FP32", shape=[-1, 1])
    assert specs_from_metadata(metadata) == (
        (TensorSpec("x", "FP32", (64,)),),
        (TensorSpec("y", "FP32", (1,)),),
    )


def test_specs_from_metadata_refuse_a_model_without_a_batch_dimension() -> None:
    metadata = service_pb2.ModelMetadataResponse(name="m")
    metadata.inputs.add(name="x", datatype="FP32", shape=[64])
    with pytest.raises(KServeCodecError, match=r"'x' has shape \[64\]; expected a leading batch dimension"):
        specs_from_metadata(metadata)


def test_specs_from_config_keep_input_dims_and_take_the_output_reshape() -> None:
    config = model_config_pb2.ModelConfig(
        name="m",
        max_batch_size=8,
        input=[
            model_config_pb2.ModelInput(
                name="c", data_type=model_config_pb2.TYPE_INT32, dims=[1], reshape={"shape": []}
            )
        ],
        output=[
            model_config_pb2.ModelOutput(
                name="s", data_type=model_config_pb2.TYPE_FP32, dims=[1], reshape={"shape": []}
            ),
            model_config_pb2.ModelOutput(name="e", data_type=model_config_pb2.TYPE_FP64, dims=[4]),
        ],
    )
    assert specs_from_config(config) == (
        (TensorSpec("c", "INT32", (1,)),),
        (TensorSpec("s", "FP32", ()), TensorSpec("e", "FP64", (4,))),
    )


def test_specs_from_config_refuse_a_model_that_does_not_batch() -> None:
    with pytest.raises(KServeCodecError, match="max_batch_size is 0"):
        specs_from_config(model_config_pb2.ModelConfig(name="m", max_batch_size=0))


@pytest.mark.parametrize(
    ("datatype", "field", "value", "bounds"),
    [
        ("INT8", "int_contents", 1000, "[-128, 127]"),
        ("INT8", "int_contents", -1000, "[-128, 127]"),
        ("UINT8", "uint_contents", 300, "[0, 255]"),
        ("INT16", "int_contents", 100000, "[-32768, 32767]"),
        ("UINT16", "uint_contents", 70000, "[0, 65535]"),
    ],
)
def test_typed_contents_outside_the_datatype_are_refused_naming_the_tensor_the_datatype_and_the_range(
    datatype: str, field: str, value: int, bounds: str
) -> None:
    contents = service_pb2.InferTensorContents()
    getattr(contents, field).extend([1, value])
    with pytest.raises(KServeCodecError) as refused:
        tensor_from_contents(contents, datatype, [2], "input 'x'")
    message = str(refused.value)
    assert "input 'x'" in message and datatype in message and bounds in message and str(value) in message


def test_typed_contents_within_a_narrow_datatype_keep_their_values() -> None:
    contents = service_pb2.InferTensorContents(int_contents=[-128, 0, 127])
    array = tensor_from_contents(contents, "INT8", [3], "input 'x'")
    assert array.dtype == np.int8 and array.tolist() == [-128, 0, 127]
