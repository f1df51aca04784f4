"""Pandas and Arrow inputs to request batches, answers back to Spark types, return types."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from udfserve.spark_client.api.return_types import spark_return_type
from udfserve.spark_client.common.model_spec import ModelSpec, Tensor
from udfserve.spark_client.executor.convert import answer_to_spark_columns, arrow_to_request, match_inputs
from udfserve.spark_client.executor.pandas_convert import (
    answer_to_pandas,
    pandas_pieces,
    pandas_to_request,
    series_to_arrow,
)

MULTI = ModelSpec(
    "multi_io",
    1,
    inputs=(Tensor("category", "int32", ()), Tensor("numeric", "float32", (8,))),
    outputs=(Tensor("score", "float32", ()), Tensor("embedding", "float32", (4,))),
)
SEQUENCE = ModelSpec(
    "sequence", 1, inputs=(Tensor("lines", "float32", (2, 3)),), outputs=(Tensor("p", "float32", (2,)),)
)


def array_series(values: np.ndarray) -> pd.Series:
    """What Spark hands a pandas UDF for an array column: a Series of numpy arrays (nested for 2-D)."""
    rows = np.empty(len(values), dtype=object)
    for i, row in enumerate(values):
        if row.ndim == 1:
            rows[i] = row
        else:
            rows[i] = np.empty(len(row), dtype=object)
            rows[i][:] = list(row)
    return pd.Series(rows, dtype=object)


def test_an_array_column_becomes_a_list_array_of_the_same_values() -> None:
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    converted = series_to_arrow(array_series(values))
    assert converted.type == pa.list_(pa.float32())
    assert np.array_equal(np.stack(converted.to_numpy(zero_copy_only=False)), values)


def test_a_nested_array_column_becomes_nested_lists() -> None:
    values = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    converted = series_to_arrow(array_series(values))
    assert converted.type == pa.list_(pa.list_(pa.float32()))
    assert converted.to_pylist() == values.tolist()


def test_a_numeric_column_stays_primitive() -> None:
    converted = series_to_arrow(pd.Series([1, 2, 3], dtype="int32"))
    assert converted.type == pa.int32() and converted.to_pylist() == [1, 2, 3]


def test_a_null_row_is_kept_as_a_null_for_the_server_to_name() -> None:
    series = pd.Series([np.zeros(2, np.float32), None], dtype=object)
    assert series_to_arrow(series).null_count == 1


def test_struct_fields_feed_the_inputs_by_name_whatever_their_order() -> None:
    frame = pd.DataFrame({"numeric": list(np.ones((2, 8), np.float32)), "category": [3, 4]})
    request = pandas_to_request(frame, MULTI)
    assert request.schema.names == ["category", "numeric"]
    assert request.column(0).to_pylist() == [3, 4]


def test_unnamed_columns_feed_the_inputs_in_the_models_order() -> None:
    request = pandas_to_request((pd.Series([3, 4]), array_series(np.ones((2, 8), np.float32))), MULTI)
    assert request.column("category").to_pylist() == [3, 4]


def test_an_integer_column_with_a_null_reaching_a_pandas_udf_as_nan_is_refused_naming_the_null() -> None:
    category = pd.Series([3.0, np.nan, 4.0])  # Spark's int column [3, null, 4] in a pandas UDF
    with pytest.raises(ValueError) as refused:
        pandas_to_request((category, array_series(np.ones((3, 8), np.float32))), MULTI)
    assert str(refused.value).startswith(
        "model 'multi_io': input 'category' takes int32 values and its column holds a null "
        "(row 1 of the request)"
    )
    assert "expected no nulls" in str(refused.value)


def test_a_float_column_with_nan_for_a_float_input_is_sent_as_it_is() -> None:
    numeric = array_series(np.full((2, 8), np.nan, np.float32))
    request = pandas_to_request((pd.Series([3, 4]), numeric), MULTI)
    assert np.isnan(request.column("numeric").flatten().to_numpy()).all()


def test_the_wrong_number_of_columns_is_refused_naming_the_inputs() -> None:
    with pytest.raises(ValueError, match=r"input\(s\) \['category', 'numeric'\].*received \['column 0'\]"):
        pandas_to_request((pd.Series([1]),), MULTI)


def test_matching_prefers_names_over_positions() -> None:
    assert match_inputs(["numeric", "category", "extra"], MULTI, "columns") == [1, 0]
    assert match_inputs(["a", "b"], MULTI, "columns") == [0, 1]


def test_an_arrow_struct_column_feeds_the_inputs_by_field_name() -> None:
    numeric = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(16, np.float32)), 8)
    struct = pa.StructArray.from_arrays(
        [numeric, pa.array([1, 2], pa.int32())], names=["numeric", "category"]
    )
    batch = pa.RecordBatch.from_arrays([pa.array([10, 11]), struct], names=["id", "x"])
    request = arrow_to_request(batch, ["x"], MULTI)
    assert request.schema.names == ["category", "numeric"]
    assert request.column(0).to_pylist() == [1, 2]


def test_a_single_non_struct_column_for_several_inputs_is_refused() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1.0])], names=["x"])
    with pytest.raises(
        ValueError, match="must be a struct with a field per input, received column 'x' of type double"
    ):
        arrow_to_request(batch, ["x"], MULTI)


def test_fixed_size_answers_become_spark_lists() -> None:
    values = pa.array(np.arange(8, dtype=np.float32))
    answer = pa.RecordBatch.from_arrays([pa.FixedSizeListArray.from_arrays(values, 2)], names=["p"])
    (column,) = answer_to_spark_columns(answer, SEQUENCE)
    assert column.type == pa.list_(pa.float32())
    assert column.to_pylist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_several_outputs_become_a_dataframe_for_a_struct_result() -> None:
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float32)), 4)
    answer = pa.RecordBatch.from_arrays(
        [pa.array([0.5, 0.25], pa.float32()), embedding], names=["score", "embedding"]
    )
    frame = answer_to_pandas(answer, as_struct=True)
    assert list(frame.columns) == ["score", "embedding"]
    assert frame["score"].tolist() == [0.5, 0.25]


def test_the_return_type_is_a_scalar_an_array_or_a_struct() -> None:
    scalar = ModelSpec("s", 1, (), (Tensor("y", "float64", ()),))
    assert spark_return_type(scalar) == T.DoubleType()
    assert spark_return_type(SEQUENCE) == T.ArrayType(T.FloatType(), containsNull=False)
    assert spark_return_type(MULTI) == T.StructType(
        [
            T.StructField("score", T.FloatType()),
            T.StructField("embedding", T.ArrayType(T.FloatType(), containsNull=False)),
        ]
    )


def test_a_matrix_output_is_an_array_of_arrays() -> None:
    spec = ModelSpec("m", 1, (), (Tensor("y", "int64", (2, 3)),))
    assert spark_return_type(spec) == T.ArrayType(T.ArrayType(T.LongType(), False), False)


def spark_row(matrix: np.ndarray) -> np.ndarray:
    """A matrix as Spark hands an array of arrays to pandas: an object array of 1-d arrays."""
    row = np.empty(len(matrix), dtype=object)
    row[:] = list(matrix)
    return row


def test_a_big_pandas_batch_is_converted_in_pieces_of_the_request_size() -> None:
    series = pd.Series([spark_row(np.arange(6, dtype=np.float32).reshape(2, 3) + row) for row in range(10)])
    pieces = pandas_pieces(series, SEQUENCE, 4)
    converted = list(pieces.batches)
    assert pieces.rows == 10 and [piece.num_rows for piece in converted] == [4, 4, 2]
    assert pa.concat_batches(converted).equals(pandas_to_request(series, SEQUENCE))


def test_an_empty_pandas_batch_announces_no_rows_and_has_no_piece() -> None:
    pieces = pandas_pieces((pd.Series([], dtype=np.int32), pd.Series([], dtype=object)), MULTI, 4)
    assert (pieces.rows, list(pieces.batches)) == (0, [])


def test_a_string_column_becomes_a_string_array() -> None:
    assert series_to_arrow(pd.Series(["a", "bc", ""])).equals(pa.array(["a", "bc", ""]))


def test_a_string_output_is_a_spark_binary_column() -> None:
    spec = ModelSpec("m", 1, inputs=(Tensor("text", "string", ()),), outputs=(Tensor("tag", "string", ()),))
    assert spark_return_type(spec) == T.BinaryType()


def test_a_rows_input_bytes_add_up_over_the_model_inputs() -> None:
    assert MULTI.input_bytes_per_row() == 4 + 8 * 4
    assert SEQUENCE.input_bytes_per_row() == 2 * 3 * 4


def test_a_bool_value_counts_a_byte_as_numpy_and_kserve_hold_it() -> None:
    mask = ModelSpec("m", 1, inputs=(Tensor("mask", "bool", (16,)),), outputs=())
    assert mask.input_bytes_per_row() == 16


def test_a_row_has_no_fixed_size_with_a_free_dimension_or_a_string_input() -> None:
    free = ModelSpec("m", 1, inputs=(Tensor("tokens", "int64", (-1,)),), outputs=())
    text = ModelSpec("m", 1, inputs=(Tensor("text", "string", ()),), outputs=())
    assert free.input_bytes_per_row() is None
    assert text.input_bytes_per_row() is None
