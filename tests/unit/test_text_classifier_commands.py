"""The commands that make text models: ``models generate --text-classifier``, ``models import-hf``
and ``demo --model text_classifier``, as their help and arguments say."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from udfserve.services.cli import build_parser
from udfserve.services.demo import example_model_names, generate_command
from udfserve.services.examples.generate_models import EXAMPLES, generate_example_repository
from udfserve.services.examples.text_classifier import NAME


def help_of(*command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_models_generate_writes_the_text_classifier_only_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of("models", "generate", capsys=capsys)

    assert "--text-classifier" in text and "needs torch and transformers" in text
    assert build_parser().parse_args(["models", "generate", "--output", "r"]).text_classifier is False


def test_import_hf_defaults_to_onnx_and_offers_torch_export(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["models", "import-hf", "folder", "--repository", "r", "--name", "m"])
    text = help_of("models", "import-hf", capsys=capsys)

    assert (args.format, args.max_length, args.version, args.max_batch_size) == ("onnx", None, None, 256)
    assert "no hub, no remote code, no pickle files" in text


def test_the_demo_knows_the_text_classifier_and_generates_it_with_its_flag() -> None:
    repository = Path("/models")

    assert NAME in example_model_names()
    assert generate_command(repository, NAME)[-1] == "--text-classifier"
    assert "--text-classifier" not in generate_command(repository, "tabular_mlp")


def test_a_present_text_classifier_is_kept_unless_overwrite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in [*EXAMPLES, NAME]:
        (tmp_path / name).mkdir()

    with caplog.at_level(logging.INFO, logger="udfserve.services.examples.text_classifier"):
        names = generate_example_repository(tmp_path, include_text_classifier=True)

    assert names == [*EXAMPLES, NAME]
    assert any(record.getMessage().startswith(f"keeping {tmp_path / NAME}") for record in caplog.records)
