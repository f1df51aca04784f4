"""Integer inputs with a range (ids of an embedding table) are refused per request, before they
are batched, naming the model, the input, the row and the range."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.runtime.value_ranges import check_ranges

CATEGORY = TensorSpec(name="category", dtype="int32", range=(0, 15))
NUMERIC = TensorSpec(name="numeric", dtype="float32", shape=(8,))
INT32 = np.iinfo(np.int32)


def inputs(categories: list[int]) -> dict[str, np.ndarray]:
    return {
        "numeric": np.zeros((len(categories), 8), np.float32),
        "category": np.array(categories, np.int32),
    }


@pytest.mark.parametrize("value", [16, 99, 1000, INT32.max, INT32.min, -1])
def test_an_id_outside_the_range_is_refused_naming_the_input_the_row_and_the_range(value: int) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_ranges("multi_io", (NUMERIC, CATEGORY), inputs([3, 4, value, 5]))
    message = refused.value.message
    assert "'multi_io'" in message and "'category'" in message
    assert "row 2" in message and str(value) in message and "[0, 15]" in message


def test_ids_at_both_ends_of_the_range_pass() -> None:
    check_ranges("multi_io", (NUMERIC, CATEGORY), inputs([0, 15, 7]))


def test_the_row_of_a_matrix_input_is_the_row_not_the_element() -> None:
    spec = TensorSpec(name="tokens", dtype="int64", shape=(4,), range=(0, 9))
    tokens = np.zeros((3, 4), np.int64)
    tokens[2, 3] = 10
    with pytest.raises(InvalidInput, match="row 2 holds 10"):
        check_ranges("m", (spec,), {"tokens": tokens})


def test_inputs_without_a_range_are_not_checked() -> None:
    check_ranges("m", (TensorSpec(name="category", dtype="int32"),), {"category": np.array([INT32.max])})


def test_a_range_on_a_float_input_is_refused() -> None:
    with pytest.raises(ValidationError, match="integer dtypes only"):
        TensorSpec(name="x", dtype="float32", range=(0, 1))


@pytest.mark.parametrize("bounds", [(5, 4), (-1, 300)])
def test_a_range_upside_down_or_beyond_the_dtype_is_refused(bounds: tuple[int, int]) -> None:
    with pytest.raises(ValidationError, match=r"min <= max, within uint8's \[0, 255\]"):
        TensorSpec(name="x", dtype="uint8", range=bounds)
