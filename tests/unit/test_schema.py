"""The documented rules for a request's Arrow columns, and the shape of the output batch."""

from __future__ import annotations

import datetime
import decimal
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from udfserve.protocol.arrow_ipc import decode_batch, encode_batch
from udfserve.runtime.errors import BackendFault, InvalidInput
from udfserve.runtime.tensor_conversion import answer_bytes_at_least, batch_to_inputs, outputs_to_batch
from udfserve.runtime.tensor_spec import TensorSpec


def spec(name: str = "x", dtype: str = "float32", shape: tuple[int, ...] = ()) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype, shape=shape)


def one_column(array: pa.Array, name: str = "x") -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([array], names=[name])


def convert(array: pa.Array, tensor: TensorSpec) -> np.ndarray:
    return batch_to_inputs(one_column(array, tensor.name), "m", [tensor])[tensor.name]


def refused(array: pa.Array, tensor: TensorSpec) -> str:
    with pytest.raises(InvalidInput) as caught:
        convert(array, tensor)
    message = str(caught.value)
    assert message.startswith("model 'm': ")
    return message


def fixed_lists(values: pa.Array, size: int, length: int) -> pa.Array:
    """``length`` fixed-size lists of ``size`` over ``values`` (works for size 0 too)."""
    return pa.Array.from_buffers(pa.list_(values.type, size), length, [None], children=[values])


def nest(flat: np.ndarray, shape: tuple[int, ...], form: str) -> pa.Array:
    """Arrow column for the array of shape ``shape`` (rows first) whose values are ``flat``."""
    array: pa.Array = pa.array(flat)
    if form == "flat" and len(shape) > 2:
        shape = (shape[0], math.prod(shape[1:]))
    for axis in range(len(shape) - 1, 0, -1):
        size, length = shape[axis], math.prod(shape[:axis])
        if form == "fixed":
            array = fixed_lists(array, size, length)
        else:
            offsets = np.arange(length + 1) * size
            if form == "large":
                array = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), array)
            else:
                array = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), array)
    return array


# -- columns -------------------------------------------------------------------------------------


def test_missing_input_column_lists_expected_and_received_columns() -> None:
    batch = one_column(pa.array([1.0]), "b")
    with pytest.raises(InvalidInput, match=r"missing input column\(s\) \['a'\]; expected columns \['a'\], "):
        batch_to_inputs(batch, "m", [spec("a")])


def test_extra_columns_are_refused_by_name() -> None:
    batch = pa.record_batch({"a": pa.array([1.0]), "extra": pa.array([2.0])})
    with pytest.raises(InvalidInput, match=r"unexpected column\(s\) \['extra'\]"):
        batch_to_inputs(batch, "m", [spec("a")])


def test_a_column_given_twice_is_refused() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1.0]), pa.array([2.0])], names=["a", "a"])
    with pytest.raises(InvalidInput, match=r"\['a'\] appear more than once"):
        batch_to_inputs(batch, "m", [spec("a")])


def test_every_input_is_converted_by_name() -> None:
    batch = pa.record_batch({"b": pa.array([1, 2], pa.int64()), "a": pa.array([0.5, 1.5])})
    result = batch_to_inputs(batch, "m", [spec("a"), spec("b", "int64")])
    assert list(result) == ["a", "b"]
    np.testing.assert_array_equal(result["a"], np.array([0.5, 1.5], np.float32))
    np.testing.assert_array_equal(result["b"], np.array([1, 2]))


# -- value types ---------------------------------------------------------------------------------


def test_double_column_feeds_a_float32_input() -> None:
    result = convert(pa.array([0.25, -1.5]), spec(dtype="float32"))
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, [0.25, -1.5])


def test_integer_column_feeds_a_float_input() -> None:
    result = convert(pa.array([1, 2], pa.int16()), spec(dtype="float64"))
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, [1.0, 2.0])


def test_integers_that_fit_feed_a_narrower_integer_input() -> None:
    result = convert(pa.array([-128, 127], pa.int64()), spec(dtype="int8"))
    assert result.dtype == np.int8
    np.testing.assert_array_equal(result, [-128, 127])


def test_integers_out_of_range_are_refused_naming_the_range_and_row() -> None:
    message = refused(pa.array([1, 2, 300], pa.int64()), spec(dtype="int8"))
    assert "column 'x'" in message
    assert "[-128, 127]" in message
    assert "[1, 300]" in message
    assert "row 2" in message


def test_floats_are_refused_for_an_integer_input() -> None:
    message = refused(pa.array([1.0]), spec(dtype="int32"))
    assert "integer values" in message
    assert "received type double" in message


def test_bool_input_takes_bool_values_only() -> None:
    np.testing.assert_array_equal(convert(pa.array([True, False]), spec(dtype="bool")), [True, False])
    assert "received type int8" in refused(pa.array([1, 0], pa.int8()), spec(dtype="bool"))


# -- string values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        pa.array(["héllo", ""], pa.string()),
        pa.array(["héllo", ""], pa.large_string()),
        pa.array(["héllo".encode(), b""], pa.binary()),
        pa.array(["héllo".encode(), b""], pa.large_binary()),
    ],
    ids=["string", "large_string", "binary", "large_binary"],
)
def test_string_and_binary_columns_feed_a_string_input_as_bytes(array: pa.Array) -> None:
    result = convert(array, spec(dtype="string"))
    assert result.dtype == object
    assert result.tolist() == ["héllo".encode(), b""]


def test_lists_of_strings_feed_a_string_vector_input() -> None:
    result = convert(pa.array([["a", "b"], ["c", "d"]]), spec(dtype="string", shape=(2,)))
    assert result.shape == (2, 2)
    assert result.tolist() == [[b"a", b"b"], [b"c", b"d"]]


def test_flat_lists_of_strings_are_reshaped_to_a_string_matrix_input() -> None:
    result = convert(pa.array([["a", "b", "c", "d"]]), spec(dtype="string", shape=(2, 2)))
    assert result.tolist() == [[[b"a", b"b"], [b"c", b"d"]]]


def test_null_string_is_refused_naming_its_row() -> None:
    message = refused(pa.array(["a", None, "c"]), spec(dtype="string"))
    assert "expected no nulls, received a null row 1" in message


def test_null_string_inside_a_list_is_refused_naming_its_row() -> None:
    message = refused(pa.array([["a"], ["b"], [None]]), spec(dtype="string", shape=(1,)))
    assert "received a null value inside row 2" in message


def test_numbers_are_refused_for_a_string_input_naming_expected_and_received() -> None:
    message = refused(pa.array([1, 2], pa.int64()), spec(dtype="string"))
    assert "column 'x'" in message
    assert "a column of string scalars holding string or binary values" in message
    assert "received type int64" in message


def test_a_string_column_for_a_numeric_input_names_expected_and_received() -> None:
    message = refused(pa.array(["0.5"]), spec(dtype="float32"))
    assert "holding integer or floating-point values, received type string" in message


def test_zero_rows_of_strings_give_an_empty_object_array() -> None:
    result = convert(pa.array([], pa.list_(pa.string())), spec(dtype="string", shape=(3,)))
    assert result.shape == (0, 3) and result.dtype == object


@pytest.mark.parametrize(
    "array",
    [
        pa.array(["1.0"]),
        pa.array([b"\x00"]),
        pa.array([decimal.Decimal("1.5")]),
        pa.array([datetime.datetime(2024, 1, 1)]),
        pa.array([{"a": 1.0}]),
        pa.array([[("k", 1.0)]], pa.map_(pa.string(), pa.float64())),
        pa.array(["a"]).dictionary_encode(),
    ],
    ids=["string", "binary", "decimal", "timestamp", "struct", "map", "dictionary"],
)
def test_non_numeric_columns_are_refused(array: pa.Array) -> None:
    message = refused(array, spec(dtype="float32"))
    assert f"received type {array.type}" in message


def test_doubles_beyond_the_float32_range_become_infinities() -> None:
    np.testing.assert_array_equal(convert(pa.array([1e300, -1e300]), spec()), [np.inf, -np.inf])


def test_nan_and_infinity_pass_through() -> None:
    result = convert(pa.array([math.nan, math.inf, -math.inf]), spec())
    assert np.isnan(result[0])
    assert result[1] == np.inf
    assert result[2] == -np.inf


# -- shapes --------------------------------------------------------------------------------------


def test_fixed_size_list_of_matching_type_is_converted_without_copy() -> None:
    values = pa.array(np.arange(6, dtype=np.float32))
    result = convert(fixed_lists(values, 3, 2), spec(shape=(3,)))
    assert result.shape == (2, 3)
    assert result.ctypes.data == values.buffers()[1].address


def test_nested_lists_become_a_matrix_per_row() -> None:
    column = pa.array([[[1, 2, 3], [4, 5, 6]]], pa.list_(pa.list_(pa.float32())))
    np.testing.assert_array_equal(convert(column, spec(shape=(2, 3))), [[[1, 2, 3], [4, 5, 6]]])


def test_flat_list_is_reshaped_to_the_declared_shape() -> None:
    column = pa.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], pa.list_(pa.float64()))
    result = convert(column, spec(shape=(2, 3)))
    np.testing.assert_array_equal(result, np.arange(1, 13).reshape(2, 2, 3))


def test_large_list_is_accepted() -> None:
    column = pa.array([[1.0, 2.0]], pa.large_list(pa.float64()))
    np.testing.assert_array_equal(convert(column, spec(shape=(2,))), [[1.0, 2.0]])


def test_free_dimension_is_inferred_from_nested_lists() -> None:
    column = pa.array([[[1.0, 2.0]] * 3, [[3.0, 4.0]] * 3])
    assert convert(column, spec(shape=(-1, 2))).shape == (2, 3, 2)


def test_one_free_dimension_is_inferred_from_a_flat_list() -> None:
    column = pa.array([[1.0] * 8, [2.0] * 8])
    assert convert(column, spec(shape=(-1, 4))).shape == (2, 2, 4)


def test_flat_list_length_not_a_multiple_of_the_known_dims_is_refused() -> None:
    message = refused(pa.array([[1.0] * 6]), spec(shape=(-1, 4)))
    assert "length 6, which is not a multiple of 4" in message


def test_free_dimension_must_be_uniform_within_the_batch() -> None:
    message = refused(pa.array([[1.0, 2.0], [1.0, 2.0], [1.0]]), spec(shape=(-1,)))
    assert "row 0 has length 2, received length 1 in row 2" in message


def test_wrong_inner_length_names_expected_received_and_first_row() -> None:
    message = refused(pa.array([[1.0, 2.0, 3.0], [1.0, 2.0]]), spec(shape=(3,)))
    assert "column 'x'" in message
    assert "expected lists of length 3, received length 2 in row 1" in message


def test_wrong_length_at_an_inner_level_names_the_row() -> None:
    column = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0]]])
    message = refused(column, spec(shape=(2, 2)))
    assert "nesting level 2, received length 1 in row 1" in message


def test_fixed_size_list_of_the_wrong_size_is_refused() -> None:
    column = pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))
    assert "fixed-size lists of length 2" in refused(column, spec(shape=(3,)))


def test_list_column_for_a_scalar_input_is_refused() -> None:
    message = refused(pa.array([[1.0]]), spec())
    assert "expected a column of float32 scalars, received type list<item: double>" in message


def test_scalar_column_for_a_tensor_input_is_refused() -> None:
    assert "received type double" in refused(pa.array([1.0]), spec(shape=(2,)))


def test_two_free_dimensions_cannot_be_inferred_from_a_flat_list() -> None:
    assert "at most one free dimension" in refused(pa.array([[1.0, 2.0]]), spec(shape=(-1, -1)))


# -- nulls, empty and sliced batches -------------------------------------------------------------


def test_null_row_is_refused_naming_the_first_one() -> None:
    assert "received a null row 1" in refused(pa.array([1.0, None, None]), spec())


def test_null_list_is_refused_naming_its_row() -> None:
    assert "received a null row 1" in refused(pa.array([[1.0], None]), spec(shape=(1,)))


def test_null_inside_nested_lists_is_refused_naming_its_row() -> None:
    column = pa.array([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, None]]])
    assert "received a null value inside row 2" in refused(column, spec(shape=(1, 2)))


def test_zero_rows_give_empty_arrays_with_free_dims_zero() -> None:
    column = pa.array([], pa.list_(pa.list_(pa.float64())))
    result = convert(column, spec(shape=(-1, 3)))
    assert result.shape == (0, 0, 3)
    assert result.dtype == np.float32


def test_sliced_list_column_is_read_from_its_offset() -> None:
    column = pa.array([[0.0, 0.0], [1.0, 2.0], [3.0, 4.0], [9.0]]).slice(1, 2)
    np.testing.assert_array_equal(convert(column, spec(shape=(2,))), [[1.0, 2.0], [3.0, 4.0]])


def test_sliced_fixed_size_list_column_is_read_from_its_offset() -> None:
    column = pa.array([[0, 0], [1, 2], [3, 4]], pa.list_(pa.int64(), 2)).slice(1)
    np.testing.assert_array_equal(convert(column, spec(dtype="int64", shape=(2,))), [[1, 2], [3, 4]])


# -- the same schema again -----------------------------------------------------------------------
# Conversion plans are cached per (model, inputs, schema): a later request of a schema seen before
# must still be checked in full.


def test_ragged_lists_are_refused_after_a_valid_request_of_the_same_type() -> None:
    convert(pa.array([[1.0, 2.0], [3.0, 4.0]]), spec(shape=(2,)))
    message = refused(pa.array([[1.0, 2.0], [3.0]]), spec(shape=(2,)))
    assert "expected lists of length 2, received length 1 in row 1" in message


def test_lists_of_another_length_are_refused_after_a_valid_request_of_the_same_type() -> None:
    convert(pa.array([[1.0, 2.0, 3.0]]), spec(shape=(3,)))
    message = refused(pa.array([[1.0, 2.0], [3.0, 4.0]]), spec(shape=(3,)))
    assert "expected lists of length 3, received length 2 in row 0" in message


def test_a_null_is_refused_after_a_valid_request_of_the_same_type() -> None:
    convert(pa.array([[1.0], [2.0]]), spec(shape=(1,)))
    assert "received a null value inside row 1" in refused(pa.array([[1.0], [None]]), spec(shape=(1,)))


def test_integers_out_of_range_are_refused_after_integers_that_fit() -> None:
    convert(pa.array([1, 2], pa.int64()), spec(dtype="int8"))
    message = refused(pa.array([1, -200], pa.int64()), spec(dtype="int8"))
    assert "[-128, 127]" in message and "row 1" in message


def test_a_sliced_column_is_read_from_its_offset_after_an_unsliced_one() -> None:
    convert(pa.array([[5.0, 6.0]]), spec(shape=(2,)))
    column = pa.array([[0.0, 0.0], [1.0, 2.0], [3.0, 4.0]]).slice(1)
    np.testing.assert_array_equal(convert(column, spec(shape=(2,))), [[1.0, 2.0], [3.0, 4.0]])


def test_a_sliced_nested_column_is_read_from_its_offset_after_an_unsliced_one() -> None:
    convert(pa.array([[[5.0, 6.0]]]), spec(shape=(1, 2)))
    column = pa.array([[[0.0, 0.0]], [[1.0, 2.0]], [[3.0, 4.0]]]).slice(1)
    np.testing.assert_array_equal(convert(column, spec(shape=(1, 2))), [[[1.0, 2.0]], [[3.0, 4.0]]])


def test_a_column_of_another_type_is_checked_by_its_own_rules_after_a_valid_request() -> None:
    convert(pa.array([[1.0, 2.0]]), spec(shape=(2,)))
    message = refused(pa.array([["a", "b"]]), spec(shape=(2,)))
    assert "received type list<item: string>" in message


def test_a_column_name_missing_is_refused_after_a_valid_request_of_the_model() -> None:
    tensor = spec("a")
    batch_to_inputs(one_column(pa.array([1.0]), "a"), "m", [tensor])
    with pytest.raises(InvalidInput, match=r"missing input column\(s\) \['a'\]"):
        batch_to_inputs(one_column(pa.array([1.0]), "b"), "m", [tensor])


# -- outputs -------------------------------------------------------------------------------------


def test_outputs_become_columns_in_spec_order() -> None:
    batch = outputs_to_batch(
        {"score": np.zeros(2, np.float32), "label": np.ones(2, np.int64)},
        [spec("label", "int64"), spec("score")],
    )
    assert batch.schema.names == ["label", "score"]
    assert batch.column(0).type == pa.int64()


def test_vector_output_becomes_a_fixed_size_list() -> None:
    batch = outputs_to_batch({"y": np.arange(6, dtype=np.float32).reshape(2, 3)}, [spec("y", shape=(3,))])
    assert batch.column(0).type == pa.list_(pa.float32(), 3)
    assert batch.column(0).to_pylist() == [[0, 1, 2], [3, 4, 5]]


def test_matrix_output_becomes_nested_fixed_size_lists() -> None:
    values = np.arange(12, dtype=np.float64).reshape(3, 2, 2)
    batch = outputs_to_batch({"y": values}, [spec("y", "float64", shape=(2, -1))])
    assert batch.column(0).type == pa.list_(pa.list_(pa.float64(), 2), 2)
    assert batch.column(0).to_pylist() == values.tolist()


def test_string_output_becomes_a_binary_column() -> None:
    values = np.array([[b"a", b"bc"], [b"", b"d"]], dtype=object)
    batch = outputs_to_batch({"y": values}, [spec("y", "string", shape=(2,))])
    assert batch.column(0).type == pa.list_(pa.binary(), 2)
    assert batch.column(0).to_pylist() == values.tolist()


def test_contiguous_output_is_not_copied() -> None:
    values = np.arange(4, dtype=np.float32)
    batch = outputs_to_batch({"y": values}, [spec("y")])
    assert batch.column(0).buffers()[1].address == values.ctypes.data


def test_missing_output_is_a_backend_fault_naming_it() -> None:
    with pytest.raises(BackendFault, match="no output 'y'"):
        outputs_to_batch({"z": np.zeros(1, np.float32)}, [spec("y")])


def test_outputs_with_different_row_counts_are_a_backend_fault() -> None:
    outputs = {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}
    with pytest.raises(BackendFault, match="output 'b' has 3 rows but output 'a' has 2"):
        outputs_to_batch(outputs, [spec("a"), spec("b")])


def test_output_of_the_wrong_per_row_shape_is_a_backend_fault() -> None:
    with pytest.raises(BackendFault, match="output 'y' has shape \\(2, 4\\)"):
        outputs_to_batch({"y": np.zeros((2, 4), np.float32)}, [spec("y", shape=(3,))])


# -- properties ----------------------------------------------------------------------------------

SOURCES_FOR = {
    "float32": ["float64", "float32", "int32"],
    "float64": ["float64", "float16", "int64"],
    "int64": ["int64", "int32", "uint8"],
    "int8": ["int8"],
    "bool": ["bool"],
}


@st.composite
def valid_columns(draw: st.DrawFn) -> tuple[pa.Array, TensorSpec, np.ndarray]:
    target = draw(st.sampled_from(sorted(SOURCES_FOR)))
    source = np.dtype(draw(st.sampled_from(SOURCES_FOR[target])))
    dims = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    rows = draw(st.integers(0, 4))
    skip = draw(st.integers(0, 2))
    form = draw(st.sampled_from(["list", "large", "fixed", "flat"]))
    elements = hnp.from_dtype(source, allow_nan=True, allow_infinity=True) if source.kind == "f" else None
    data = draw(hnp.arrays(source, (skip + rows, *dims), elements=elements))
    column = nest(data.reshape(-1), data.shape, form).slice(skip, rows)

    flat = form == "flat" and len(dims) > 1
    shape = list(dims)
    for axis in range(len(dims)):
        # A flat list can carry one free dim, inferable only when the other dims are not zero.
        inferable = not flat or (-1 not in shape and all(d > 0 for i, d in enumerate(dims) if i != axis))
        if inferable and draw(st.booleans()):
            shape[axis] = -1
    expected_shape = [rows]
    for axis, dim in enumerate(dims):
        if shape[axis] != -1 or form == "fixed":
            expected_shape.append(dim)
        else:
            # A free dim is read from the lists of its level: none there means 0.
            lists_at_level = rows if flat else rows * math.prod(dims[:axis])
            expected_shape.append(dim if lists_at_level > 0 else 0)
    expected = data[skip:].reshape(expected_shape)
    with np.errstate(over="ignore"):
        expected = expected.astype(target)
    return column, spec(dtype=target, shape=tuple(shape)), expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_columns())
def test_valid_list_columns_round_trip_to_the_declared_arrays(
    case: tuple[pa.Array, TensorSpec, np.ndarray],
) -> None:
    column, tensor, expected = case
    result = convert(column, tensor)
    assert result.dtype == np.dtype(tensor.dtype)
    assert result.shape == expected.shape
    np.testing.assert_array_equal(result, expected)


@st.composite
def mismatched_columns(draw: st.DrawFn) -> tuple[pa.Array, TensorSpec]:
    dims = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    rows = draw(st.integers(1, 3))
    form = draw(st.sampled_from(["list", "large", "fixed"]))
    column = nest(np.zeros(rows * math.prod(dims), np.float32), (rows, *dims), form)
    axis = draw(st.integers(0, len(dims) - 1))
    wrong = draw(st.integers(0, 5).filter(lambda size: size != dims[axis]))
    shape = list(dims)
    shape[axis] = wrong
    return column, spec(shape=tuple(shape))


@settings(max_examples=200, deadline=None)
@given(mismatched_columns())
def test_lists_of_another_shape_are_always_refused(case: tuple[pa.Array, TensorSpec]) -> None:
    column, tensor = case
    refused(column, tensor)


def nested_values(depth: int) -> st.SearchStrategy[object]:
    leaf = st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-300, 300).map(float))
    strategy: st.SearchStrategy[object] = leaf
    for _ in range(depth):
        strategy = st.one_of(st.none(), st.lists(strategy, max_size=3))
    return strategy


@st.composite
def arbitrary_columns(draw: st.DrawFn) -> tuple[pa.Array, TensorSpec]:
    depth = draw(st.integers(0, 3))
    arrow_type: pa.DataType = pa.float64()
    for _ in range(depth):
        arrow_type = pa.list_(arrow_type)
    rows = draw(st.lists(nested_values(depth), max_size=4))
    shape = tuple(draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3]), max_size=3)))
    dtype = draw(st.sampled_from(["float32", "int16", "bool"]))
    return pa.array(rows, arrow_type), spec(dtype=dtype, shape=shape)


@settings(max_examples=300, deadline=None)
@given(arbitrary_columns())
def test_any_column_either_converts_to_the_declared_rank_or_raises_invalid_input(
    case: tuple[pa.Array, TensorSpec],
) -> None:
    column, tensor = case
    try:
        result = convert(column, tensor)
    except InvalidInput as error:
        assert str(error).startswith("model 'm': column 'x': ")
        return
    assert result.shape[0] == len(column)
    assert result.ndim == 1 + len(tensor.shape)
    assert all(want in (-1, got) for want, got in zip(tensor.shape, result.shape[1:], strict=True))


def list_column(values: np.ndarray) -> pa.Array:
    """A (rows, width) array as Spark sends ``array<float>``: a list column."""
    offsets = np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1)))


def batch_read_from(memory: bytearray | bytes, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` written as an IPC stream into ``memory`` and read back in place, as the server
    reads a request from shared memory (writable) or from a gRPC message (bytes)."""
    payload = encode_batch(batch)
    if isinstance(memory, bytearray):
        memory[: len(payload)] = payload
        return decode_batch(pa.py_buffer(memoryview(memory)[: len(payload)]))
    return decode_batch(payload)


def test_a_tensor_read_in_place_from_writable_memory_is_a_writable_view_of_it() -> None:
    values = np.arange(5 * 64, dtype=np.float32).reshape(5, 64)
    memory = bytearray(1 << 16)
    batch = batch_read_from(memory, pa.record_batch({"features": list_column(values)}))
    converted = batch_to_inputs(batch, "m", [TensorSpec(name="features", dtype="float32", shape=[64])])
    features = converted["features"]
    assert features.flags.writeable
    assert np.shares_memory(features, np.frombuffer(memory, dtype=np.uint8))
    assert np.array_equal(features, values)


def test_a_tensor_read_from_a_grpc_message_stays_a_read_only_view() -> None:
    values = np.arange(3 * 64, dtype=np.float32).reshape(3, 64)
    batch = batch_read_from(b"", pa.record_batch({"features": list_column(values)}))
    converted = batch_to_inputs(batch, "m", [TensorSpec(name="features", dtype="float32", shape=[64])])
    assert not converted["features"].flags.writeable
    assert np.array_equal(converted["features"], values)


def test_the_least_answer_size_counts_fixed_size_outputs_fully() -> None:
    specs = [
        TensorSpec(name="probabilities", dtype="float32", shape=(8,)),
        TensorSpec(name="grid", dtype="float64", shape=(2, 3)),
        TensorSpec(name="flag", dtype="bool", shape=()),
    ]
    assert answer_bytes_at_least(specs, 10) == 10 * (8 * 4 + 6 * 8 + 1)
    assert answer_bytes_at_least(specs, 0) == 0


def test_the_least_answer_size_counts_strings_and_free_dimensions_as_nothing() -> None:
    specs = [
        TensorSpec(name="text", dtype="string", shape=()),
        TensorSpec(name="ragged", dtype="float32", shape=(-1,)),
        TensorSpec(name="score", dtype="float32", shape=()),
    ]
    assert answer_bytes_at_least(specs, 100) == 100 * 4
