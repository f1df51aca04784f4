"""config.yaml's counts are integers as written: YAML reads ``true`` as a boolean and ``1.0e+3`` as a
float, which a lax parse would take for 1 and 1,000, sizing a batch or a queue by a typo."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from udfserve.runtime.repository import parse_model_config
from udfserve.runtime.tensor_spec import TensorSpec


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("max_batch_size: true", "max_batch_size", "True"),
        ("max_batch_size: 1.0e+3", "max_batch_size", "1000.0"),
        ("version: true", "version", "True"),
        ("dynamic_batching: {max_queue_rows: 2.0e+3}", r"dynamic_batching\.max_queue_rows", "2000.0"),
        ("version_policy: {latest: true}", r"version_policy\.latest", "True"),
        ("version_policy: {specific: [1, 2.0]}", r"version_policy\.specific\.1", "2.0"),
        ("preprocess: {max_length: 1.28e+2}", r"preprocess\.max_length", "128.0"),
    ],
)
def test_a_boolean_or_a_float_where_a_count_belongs_is_refused_naming_the_field(
    text: str, field: str, value: str
) -> None:
    with pytest.raises(
        ValueError, match=rf"m/config\.yaml: invalid model config: {field}: .*integer.*{value}"
    ):
        parse_model_config(yaml.safe_load(text), "m/config.yaml")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("inputs: [{name: x, shape: [true, 4]}]", r"inputs\.0\.shape"),
        ("inputs: [{name: ids, dtype: int32, range: [0, 1.0e+3]}]", r"inputs\.0\.range"),
    ],
)
def test_a_boolean_or_a_float_in_a_declared_shape_or_range_is_refused(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field}: .*expected integers"):
        parse_model_config(yaml.safe_load(text), "m/config.yaml")


def test_integers_as_written_are_read_as_before() -> None:
    config = parse_model_config(
        yaml.safe_load(
            "max_batch_size: 64\nversion_policy: {specific: [1, 2]}\n"
            "dynamic_batching: {max_queue_rows: 640}\ninputs: [{name: x, shape: [-1, 4]}]"
        ),
        "m/config.yaml",
    )

    assert (config.max_batch_size, config.max_queue_rows, config.versions.specific) == (64, 640, (1, 2))
    assert config.inputs is not None and config.inputs[0].shape == (-1, 4)


def test_a_backend_s_numpy_integers_still_make_a_tensor_spec() -> None:
    assert TensorSpec(name="x", shape=(np.int64(3), -1)).shape == (3, -1)
