"""A KServe ``model_version`` is digits of a version number, or empty for the served one; anything
else is INVALID_ARGUMENT naming the field, however long."""

from __future__ import annotations

import grpc
import pytest

from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.kserve.tensors import parse_version


@pytest.mark.parametrize(("text", "version"), [("", 0), ("1", 1), ("999999999999999999", 999999999999999999)])
def test_digits_and_nothing_are_versions(text: str, version: int) -> None:
    assert parse_version(text, "m") == version


@pytest.mark.parametrize("digits", [19, 4_301, 100_000])
def test_a_version_of_too_many_digits_is_invalid_naming_the_field_and_its_length(digits: int) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_version("7" * digits, "tabular_mlp")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    message = refused.value.message
    assert "model_version" in message and f"{digits} characters" in message and "at most 18 digits" in message
    assert len(message) < 400


@pytest.mark.parametrize("text", ["v1", "-1", "1.0", "\u0661"])
def test_anything_but_ascii_digits_is_invalid(text: str) -> None:
    with pytest.raises(InvalidInput, match="model_version"):
        parse_version(text, "m")
