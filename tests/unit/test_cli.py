"""The `udfserve` command line: flags, environment variables and their precedence."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from udfserve.services.cli import build_parser
from udfserve.services.examples.generate_models import (
    EXAMPLES,
    SAVEDMODEL_SUFFIX,
    generate_example_repository,
)
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.node.config import NodeConfig
from udfserve.services.settings_cli import SettingsError, settings_from_args


def serve_config(*argv: str) -> ServerConfig:
    return settings_from_args(ServerConfig, build_parser().parse_args(["serve", *argv]))


def test_serve_help_documents_every_setting_with_its_flag_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    for field in ServerConfig.model_fields:
        assert "--" + field.replace("_", "-") in help_text
        assert "UDFSERVE_" + field.upper() in help_text.replace("\n", "").replace(" ", "")


def test_a_flag_wins_over_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UDFSERVE_PORT", "9100")
    assert serve_config("--model-repository", "/models", "--port", "9200").port == 9200


def test_the_environment_variable_applies_when_no_flag_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UDFSERVE_MODEL_REPOSITORY", "/srv/models")
    monkeypatch.setenv("UDFSERVE_MODELS", "tabular_mlp, multi_io")
    config = serve_config()
    assert config.model_repository == Path("/srv/models")
    assert config.models == ("tabular_mlp", "multi_io")


def test_an_invalid_environment_value_names_the_variable_and_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UDFSERVE_PORT", "eighty")
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/models")
    assert "UDFSERVE_PORT" in str(raised.value) and "--port" in str(raised.value)
    assert "eighty" in str(raised.value)


def test_an_invalid_device_says_what_is_expected() -> None:
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/models", "--device", "tpu:0")
    assert "tpu:0" in str(raised.value) and "gpu:N" in str(raised.value)


def test_port_off_disables_the_tcp_listener() -> None:
    config = serve_config("--model-repository", "/m", "--port", "off", "--socket", "/tmp/s.sock")
    assert config.port is None


def test_no_listener_at_all_is_refused() -> None:
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/m", "--port", "off")
    assert "nothing to listen on" in str(raised.value)


def test_a_model_name_with_a_path_separator_is_refused() -> None:
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/m", "--models", "../etc")
    assert "invalid model name" in str(raised.value)


def test_shared_memory_uids_are_read_as_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve_config(
        "--model-repository", "/m", "--shared-memory-uids", "185, 1000"
    ).shared_memory_uids == (
        185,
        1000,
    )
    monkeypatch.setenv("UDFSERVE_SHARED_MEMORY_UIDS", "185")
    assert serve_config("--model-repository", "/m").shared_memory_uids == (185,)


def test_a_shared_memory_uid_that_is_not_a_number_is_refused_saying_what_is_expected() -> None:
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/m", "--shared-memory-uids", "spark")
    assert "'spark'" in str(raised.value) and "numeric uids" in str(raised.value)


def help_of(*command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks undone


@pytest.mark.parametrize("command", ["serve", "node"])
def test_log_level_help_says_what_it_sets_and_the_levels(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_of(command, capsys=capsys)
    assert "--log-level LOG_LEVEL log level of" in text
    assert "DEBUG, INFO, WARNING or ERROR" in text


@pytest.mark.parametrize("settings_cls", [ServerConfig, NodeConfig])
def test_every_setting_has_a_description_for_its_help(settings_cls: type[ServerConfig | NodeConfig]) -> None:
    assert [name for name, field in settings_cls.model_fields.items() if not field.description] == []


def test_serve_help_shows_defaults_as_they_are_typed_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of("serve", capsys=capsys)
    assert "PosixPath" not in text and "()" not in text and "'" + "cpu" + "'" not in text
    assert "[env UDFSERVE_SHARED_MEMORY_DIR; default: /dev/shm]" in text
    assert "[env UDFSERVE_SHARED_MEMORY_UIDS; default: none]" in text
    assert "[env UDFSERVE_ALLOW_INSECURE_REMOTE; default: off]" in text
    assert "[env UDFSERVE_DEVICE; default: cpu]" in text


def test_an_empty_default_the_description_explains_is_not_repeated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of("node", capsys=capsys)
    assert "load only these models, comma separated (default: all) [env UDFSERVE_MODELS]" in text
    assert "[env UDFSERVE_DISCOVERY_FILE]" in text


def test_a_default_computed_at_start_is_shown_as_computed_here(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of("node", capsys=capsys)
    assert f"[env UDFSERVE_RUNTIME_DIR; default: /tmp/udfserve-{os.geteuid()}]" in text


def test_models_generate_help_names_every_model_it_writes(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of("models", "generate", capsys=capsys)
    for name in EXAMPLES:
        assert name in text
    assert f"tabular_mlp{SAVEDMODEL_SUFFIX}" in text


def test_keeping_a_present_model_names_the_flag_that_regenerates_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in EXAMPLES:
        (tmp_path / name).mkdir()
    with caplog.at_level(logging.INFO, logger="udfserve.services.examples.generate_models"):
        assert generate_example_repository(tmp_path) == list(EXAMPLES)
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("keeping")]
    assert len(kept) == len(EXAMPLES)
    assert all("pass --overwrite to regenerate" in message for message in kept)


def test_tracked_applications_above_the_cap_are_refused_with_the_reason() -> None:
    with pytest.raises(SettingsError) as raised:
        serve_config("--model-repository", "/models", "--max-tracked-apps", "10000")
    message = str(raised.value)
    assert "--max-tracked-apps" in message and "at most 512" in message and "10000" in message
    assert "/metrics" in message
