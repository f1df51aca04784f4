"""The demo's generated inputs sized from a model's declared inputs, and its answers as text."""

from __future__ import annotations

from pyspark.sql import Row

from udfserve.services.demo_data import (
    FREE_DIMENSION,
    SAMPLE_VALUES,
    describe_inputs,
    format_value,
    values_per_row,
)
from udfserve.spark_client.common.model_spec import Tensor


def test_a_tensor_input_gets_a_flat_array_of_its_shapes_size() -> None:
    assert values_per_row(Tensor("lines", "float32", (16, 32))) == 512
    assert values_per_row(Tensor("category", "int32", ())) == 1


def test_a_free_dimension_gets_a_fixed_number_of_values() -> None:
    assert values_per_row(Tensor("tokens", "int64", (-1, 4))) == FREE_DIMENSION * 4


def test_the_generated_inputs_are_described_by_name_size_and_dtype() -> None:
    inputs = [Tensor("category", "int32", ()), Tensor("numeric", "float32", (8,))]
    assert describe_inputs(inputs) == "category: int32, numeric: 8 float32"


def test_a_struct_answer_is_shown_as_its_outputs_by_name() -> None:
    answer = Row(score=0.25, embedding=[0.5, -1.0])
    assert format_value(answer) == "score=0.250, embedding=[0.500 -1.000]"


def test_a_long_array_answer_shows_its_first_values_and_an_ellipsis() -> None:
    text = format_value([0.0] * (SAMPLE_VALUES + 1))
    assert text == "[" + " ".join(["0.000"] * SAMPLE_VALUES) + " ...]"
