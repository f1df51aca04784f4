"""config.yaml's ``preprocess`` step: what a text model's config may say, refused when it cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from udfserve.runtime.model_config import MAX_TOKENS, ModelConfig, TextPreprocess
from udfserve.runtime.repository import parse_model_config, scan_repository


def test_a_step_given_by_its_tokenizer_alone_feeds_ids_and_mask_of_a_text_input() -> None:
    config = ModelConfig.model_validate({"preprocess": {"tokenizer": "tokenizer.json"}})

    assert config.preprocess == TextPreprocess(
        tokenizer="tokenizer.json",
        input="text",
        max_length=128,
        pad_token="[PAD]",
        outputs=("input_ids", "attention_mask"),
    )


@pytest.mark.parametrize(
    "tokenizer", ["../tokenizer.json", "sub/tokenizer.json", "/etc/passwd", ".hidden", ""]
)
def test_a_tokenizer_that_is_not_a_file_name_of_the_version_folder_is_refused(tokenizer: str) -> None:
    with pytest.raises(
        ValueError, match=r"preprocess\.tokenizer.*expected the name of a file in the version folder"
    ):
        parse_model_config({"preprocess": {"tokenizer": tokenizer}}, "config.yaml")


def test_an_output_no_tokenizer_gives_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"distinct names among input_ids, attention_mask, token_type_ids; unknown: \[.pixel_values.\]",
    ):
        parse_model_config({"preprocess": {"outputs": ["input_ids", "pixel_values"]}}, "config.yaml")


@pytest.mark.parametrize("max_length", [0, MAX_TOKENS + 1])
def test_max_length_is_bounded(max_length: int) -> None:
    with pytest.raises(ValueError, match=r"preprocess\.max_length"):
        parse_model_config({"preprocess": {"max_length": max_length}}, "config.yaml")


def test_unknown_fields_of_the_step_are_refused() -> None:
    with pytest.raises(ValueError, match=r"preprocess\.padding: Extra inputs are not permitted"):
        parse_model_config({"preprocess": {"padding": "max_length"}}, "config.yaml")


def test_inputs_declared_with_a_step_are_the_model_files_own_integer_sequences() -> None:
    config = ModelConfig.model_validate(
        {
            "preprocess": {},
            "inputs": [
                {"name": "attention_mask", "dtype": "int64", "shape": [-1]},
                {"name": "input_ids", "dtype": "int64", "shape": [-1]},
            ],
        }
    )

    assert config.inputs is not None and [spec.name for spec in config.inputs] == [
        "attention_mask",
        "input_ids",
    ]


def test_the_public_string_input_declared_as_inputs_with_a_step_is_refused_saying_what_inputs_means() -> None:
    with pytest.raises(
        ValueError, match=r"the model's own inputs, which the tokenizer feeds: expected \['input_ids'"
    ):
        parse_model_config(
            {"preprocess": {}, "inputs": [{"name": "text", "dtype": "string", "shape": []}]}, "config.yaml"
        )


def test_the_tokenizer_file_is_part_of_the_version_fingerprint(tmp_path: Path) -> None:
    """A new tokenizer.json is a new version of the model to a server that watches the repository."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text("preprocess: {tokenizer: tokenizer.json}\n")
    (version / "model.onnx").write_bytes(b"onnx")
    (version / "tokenizer.json").write_text("{}")
    before = scan_repository(tmp_path).sources[0].fingerprint

    (version / "tokenizer.json").write_text('{"version": "1.0"}')

    assert scan_repository(tmp_path).sources[0].fingerprint != before


def test_a_tokenizer_that_resolves_outside_the_repository_fails_the_scan_naming_it(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    repository = tmp_path / "repository"
    version = repository / "m" / "1"
    version.mkdir(parents=True)
    (repository / "m" / "config.yaml").write_text("preprocess: {tokenizer: tokenizer.json}\n")
    (version / "model.onnx").write_bytes(b"onnx")
    (version / "tokenizer.json").symlink_to(outside)

    scan = scan_repository(repository)

    assert scan.sources == ()
    assert f"{version / 'tokenizer.json'} resolves to {outside}, outside the repository" in scan.failures["m"]
