"""The version of each row: the return types that hold it, and the rows of a Spark batch that two
versions answered."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from udfserve.spark_client.api.return_types import resolve_return_type
from udfserve.spark_client.common.model_spec import ModelSpec, Tensor
from udfserve.spark_client.common.versions import empty_versioned, kserve_version, with_version_column
from udfserve.spark_client.executor.convert import answer_to_array
from udfserve.spark_client.executor.rechunk import Rechunker

MLP = ModelSpec("mlp", 1, (Tensor("features", "float32", (4,)),), (Tensor("probabilities", "float32", (3,)),))
MULTI = ModelSpec(
    "multi",
    1,
    (Tensor("numeric", "float32", (8,)),),
    (Tensor("score", "float32", ()), Tensor("embedding", "float32", (4,))),
)
PROBABILITIES = T.StructField("probabilities", T.ArrayType(T.FloatType(), containsNull=False))


def test_with_version_makes_the_model_type_a_struct_of_the_outputs_and_a_bigint_version() -> None:
    resolved = resolve_return_type(MULTI, None, None, with_version=True)
    assert resolved.with_version and resolved.as_struct
    assert resolved.return_type.simpleString() == (  # type: ignore[union-attr]
        "struct<score:float,embedding:array<float>,model_version:bigint>"
    )


def test_a_struct_return_type_with_a_model_version_field_asks_for_the_version() -> None:
    given = T.StructType([T.StructField("model_version", T.LongType()), PROBABILITIES])
    resolved = resolve_return_type(MLP, given, None, with_version=False)
    assert resolved.with_version
    assert resolved.fields == ["model_version", "probabilities"]


def test_without_the_field_or_the_flag_no_version_is_answered() -> None:
    assert not resolve_return_type(MLP, None, None, with_version=False).with_version
    assert not resolve_return_type(MLP, T.StructType([PROBABILITIES]), None, with_version=False).with_version


@pytest.mark.parametrize(
    "return_type",
    [T.ArrayType(T.FloatType(), containsNull=False), T.StructType([PROBABILITIES]), "array<float>"],
    ids=["a column", "a struct without the field", "a DDL column"],
)
def test_with_version_refuses_a_return_type_without_a_model_version_struct_field(
    return_type: T.DataType | str,
) -> None:
    with pytest.raises(
        ValueError, match=r"struct field 'model_version'; expected a struct return type"
    ) as refusal:
        resolve_return_type(MLP, return_type, None, with_version=True)
    assert "struct<probabilities: ..., model_version: bigint>" in str(refusal.value)


def test_a_model_version_field_of_another_type_than_bigint_is_refused() -> None:
    given = T.StructType([PROBABILITIES, T.StructField("model_version", T.IntegerType())])
    with pytest.raises(ValueError, match=r"field 'model_version' is int; expected bigint"):
        resolve_return_type(MLP, given, None, with_version=False)


def test_with_version_is_refused_for_a_model_with_an_output_of_that_name() -> None:
    spec = ModelSpec("m", 1, MLP.inputs, (Tensor("model_version", "int64", ()),))
    with pytest.raises(ValueError, match=r"has an output named 'model_version'"):
        resolve_return_type(spec, None, None, with_version=True)
    assert not resolve_return_type(
        spec, T.StructType([T.StructField("model_version", T.LongType())]), None, False
    ).with_version


def answer(version: int, rows: int) -> pa.RecordBatch:
    values = pa.array([[float(version)] * 3] * rows, type=pa.list_(pa.float32(), 3))
    return with_version_column(pa.RecordBatch.from_arrays([values], names=["probabilities"]), version)


def test_the_rows_of_one_spark_batch_keep_the_version_of_the_request_that_computed_them() -> None:
    rechunker: Rechunker[str] = Rechunker(100, 1 << 20, empty_versioned(MLP.empty_outputs()))
    features = pa.array([[0.0] * 4] * 250, type=pa.list_(pa.float32(), 4))
    spark_batch = pa.RecordBatch.from_arrays([features], names=["features"])
    requests = list(rechunker.requests([("batch", spark_batch)]))
    assert [r.num_rows for r in requests] == [100, 100, 50]
    answers = [answer(1, 100), answer(2, 100), answer(2, 50)]  # the server switched after one request
    ((carry, joined),) = list(rechunker.answers(answers))
    struct = answer_to_array(joined, MLP, as_struct=True)
    assert carry == "batch" and struct.type.names == ["probabilities", "model_version"]
    versions = struct.field("model_version").to_pylist()
    assert versions == [1] * 100 + [2] * 150
    assert [row[0] for row in struct.field("probabilities").to_pylist()] == [float(v) for v in versions]


def test_an_empty_spark_batch_is_answered_with_the_version_column_too() -> None:
    rechunker: Rechunker[str] = Rechunker(100, 1 << 20, empty_versioned(MLP.empty_outputs()))
    empty = pa.RecordBatch.from_arrays([pa.nulls(0, pa.list_(pa.float32(), 4))], names=["features"])
    assert list(rechunker.requests([("empty", empty)])) == []
    ((_, joined),) = list(rechunker.answers([]))
    assert joined.schema.names == ["probabilities", "model_version"] and joined.num_rows == 0


@pytest.mark.parametrize(("text", "version"), [("3", 3), ("", 0), ("latest", 0)])
def test_a_kserve_answer_names_its_version_as_text_and_anything_else_is_unknown(
    text: str, version: int
) -> None:
    assert kserve_version(text) == version
