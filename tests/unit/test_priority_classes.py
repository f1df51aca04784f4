"""The server's priority classes: what ``--priority-classes`` accepts, and what it refuses by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.priority_classes import parse_priority_classes


def test_classes_are_read_as_names_and_weights() -> None:
    assert parse_priority_classes(("interactive=8", "batch=1")) == {"interactive": 8, "batch": 1}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (("interactive",), "is not 'name=weight'"),
        (("Interactive=2",), "lower-case name"),
        (("fast=0",), "expected a weight from 1 to 1000"),
        (("fast=2", "fast=3"), "is given twice"),
        ((), "expected at least one priority class"),
    ],
)
def test_a_class_list_that_is_not_name_equals_weight_is_refused_naming_the_item(
    items: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_priority_classes(items)


def test_the_default_class_must_be_one_of_the_classes(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match="default_priority_class 'gold' is not one of the priority classes"
    ):
        ServerConfig(model_repository=tmp_path, socket=tmp_path / "s.sock", default_priority_class="gold")


def test_the_classes_are_given_comma_separated_as_the_flag_takes_them(tmp_path: Path) -> None:
    config = ServerConfig(
        model_repository=tmp_path,
        socket=tmp_path / "s.sock",
        priority_classes="gold=5, default=1",  # type: ignore[arg-type]
    )
    assert config.class_weights == {"gold": 5, "default": 1}
