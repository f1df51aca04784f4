"""``udfserve models generate --backend-examples``: its choices are the registry's entries that
name an examples function, and a name without examples is refused naming those that have them."""

from __future__ import annotations

import pytest

from udfserve.runtime.backend_registry import FORMATS
from udfserve.services.cli import build_parser
from udfserve.services.examples.backend_examples import backend_example_names, backends_with_examples


def test_the_choices_are_the_registry_entries_with_examples() -> None:
    assert backends_with_examples() == tuple(f.backend for f in FORMATS if f.examples)
    assert "xgboost" in backends_with_examples()


def test_the_option_reads_comma_separated_names() -> None:
    args = build_parser().parse_args(["models", "generate", "--output", "r", "--backend-examples", "xgboost"])

    assert args.backend_examples == ("xgboost",)


def test_a_backend_without_examples_is_refused_naming_those_with() -> None:
    with pytest.raises(ValueError, match=r"--backend-examples 'onnxruntime': expected some of xgboost"):
        backend_example_names("onnxruntime")
