"""A ``return_type`` that cannot hold a model's answers unchanged is refused in the driver, naming
the model, the output and the types that would do; one that can is accepted."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from udfserve.spark_client.api.return_types import check_return_type, spark_return_type
from udfserve.spark_client.common.model_spec import ModelSpec, Tensor

VECTOR = ModelSpec("tabular", 1, (Tensor("x", "float32", (4,)),), (Tensor("p", "float32", (8,)),))
MULTI = ModelSpec(
    "multi_io",
    1,
    (Tensor("numeric", "float32", (8,)),),
    (Tensor("score", "float32", ()), Tensor("embedding", "float32", (4,))),
)


def single(dtype: str, shape: tuple[int, ...] = ()) -> ModelSpec:
    return ModelSpec("m", 1, (Tensor("x", "float32", ()),), (Tensor("y", dtype, shape),))


def floats(element: T.DataType) -> T.ArrayType:
    return T.ArrayType(element)


@pytest.mark.parametrize("spec", [VECTOR, MULTI, single("int64", (2, 3)), single("string"), single("uint8")])
def test_the_declared_return_type_is_accepted(spec: ModelSpec) -> None:
    check_return_type(spec, spark_return_type(spec), as_struct=len(spec.outputs) > 1)


def test_a_float_output_may_widen_to_double() -> None:
    check_return_type(VECTOR, floats(T.DoubleType()), as_struct=False)


def test_a_float_output_as_integers_is_refused_naming_what_would_do() -> None:
    """A pandas UDF declared array<int> truncates every probability to 0 without a word."""
    with pytest.raises(
        ValueError,
        match=r"model 'tabular': the return type is array<int>, which cannot hold output 'p' \(float32, "
        r"per-row shape \[8\]\) unchanged; expected array<float> or array<double>",
    ):
        check_return_type(VECTOR, floats(T.IntegerType()), as_struct=False)


@pytest.mark.parametrize("element", [T.BooleanType(), T.StringType(), T.BinaryType(), T.DecimalType(10, 2)])
def test_a_float_output_as_another_kind_of_value_is_refused(element: T.DataType) -> None:
    with pytest.raises(ValueError, match="cannot hold output 'p'"):
        check_return_type(VECTOR, floats(element), as_struct=False)


@pytest.mark.parametrize("declared", [T.FloatType(), T.ArrayType(T.ArrayType(T.FloatType()))])
def test_another_nesting_than_the_outputs_shape_is_refused(declared: T.DataType) -> None:
    with pytest.raises(ValueError, match=r"per-row shape \[8\]\) unchanged; expected array<float>"):
        check_return_type(VECTOR, declared, as_struct=False)


def test_an_integer_output_may_widen_but_not_narrow() -> None:
    check_return_type(single("int32"), T.LongType(), as_struct=False)
    check_return_type(single("int32"), T.DoubleType(), as_struct=False)
    with pytest.raises(ValueError, match="expected int or bigint or double"):
        check_return_type(single("int32"), T.ShortType(), as_struct=False)


def test_an_int64_output_as_double_is_refused_for_losing_digits() -> None:
    with pytest.raises(ValueError, match=r"expected bigint$"):
        check_return_type(single("int64"), T.DoubleType(), as_struct=False)


def test_a_uint8_output_needs_a_signed_type_wider_than_a_byte() -> None:
    with pytest.raises(ValueError, match="expected smallint or int or bigint or float or double"):
        check_return_type(single("uint8"), T.ByteType(), as_struct=False)


def test_a_string_output_may_be_a_spark_string() -> None:
    check_return_type(single("string"), T.StringType(), as_struct=False)


def test_a_struct_field_of_the_wrong_kind_is_refused_naming_the_field() -> None:
    declared = T.StructType(
        [T.StructField("score", T.BooleanType()), T.StructField("embedding", floats(T.FloatType()))]
    )
    with pytest.raises(
        ValueError, match=r"the return type's field 'score' is boolean, which cannot hold output 'score'"
    ):
        check_return_type(MULTI, declared, as_struct=True)


def test_a_struct_field_named_after_no_output_is_refused_naming_the_outputs() -> None:
    declared = T.StructType([T.StructField("a", T.FloatType())])
    with pytest.raises(ValueError, match=r"field\(s\) \['a'\] are not outputs .* \['score', 'embedding'\]"):
        check_return_type(MULTI, declared, as_struct=True)


def test_several_outputs_into_one_column_are_refused_naming_the_outputs() -> None:
    with pytest.raises(
        ValueError, match=r"has outputs \['score', 'embedding'\]; expected a struct return type"
    ):
        check_return_type(MULTI, T.FloatType(), as_struct=False)


def test_an_unparsed_ddl_string_is_left_to_spark() -> None:
    check_return_type(VECTOR, "array<int>", as_struct=False)
