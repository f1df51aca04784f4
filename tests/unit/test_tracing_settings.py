"""Tracing's settings are settings of ``udfserve serve`` and ``udfserve node``: flags listed under
observability, ``UDFSERVE_TRACING_*`` variables (their names unchanged), ``--config`` keys; a flag
wins over the variable, the variable over the file; a node gives its values to every server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.launcher import serve_arguments, server_command
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot
from udfserve.services.settings_cli import SettingsError, settings_from_args
from udfserve.services.settings_groups import group_of

TRACING = (
    "tracing_otlp_endpoint",
    "tracing_otlp_insecure",
    "tracing_spans_file",
    "tracing_sample_ratio",
    "tracing_service_name",
)


@pytest.fixture(autouse=True)
def no_udfserve_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("UDFSERVE_"):
            monkeypatch.delenv(name)


def serve_config(*argv: str) -> ServerConfig:
    return settings_from_args(ServerConfig, build_parser().parse_args(["serve", *argv]))


def node_config(*argv: str) -> NodeConfig:
    return settings_from_args(NodeConfig, build_parser().parse_args(["node", *argv]))


def test_tracing_is_off_by_default() -> None:
    config = serve_config("--model-repository", "/srv/models")

    assert not config.tracing_enabled
    assert (config.tracing_sample_ratio, config.tracing_service_name) == (0.0, "udfserve-model-server")


@pytest.mark.parametrize("name", TRACING)
def test_each_tracing_setting_is_listed_under_observability(name: str) -> None:
    assert group_of(name) == "observability"


@pytest.mark.parametrize("command", ["serve", "node"])
def test_both_commands_help_lists_the_tracing_flags_with_their_variables(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    observability = text[text.index("\nobservability:") :]

    for name in TRACING:
        flag = "--" + name.replace("_", "-")
        assert flag in observability, f"{flag} is not under observability in `udfserve {command} --help`"
    assert "UDFSERVE_TRACING_OTLP_ENDPOINT" in text and "UDFSERVE_TRACING_SAMPLE_RATIO" in text


def test_the_variables_keep_their_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UDFSERVE_TRACING_SPANS_FILE", str(tmp_path / "spans.jsonl"))
    monkeypatch.setenv("UDFSERVE_TRACING_SAMPLE_RATIO", "0.25")
    monkeypatch.setenv("UDFSERVE_TRACING_OTLP_INSECURE", "false")

    config = serve_config("--model-repository", str(tmp_path))

    assert config.tracing_spans_file == tmp_path / "spans.jsonl" and config.tracing_enabled
    assert (config.tracing_sample_ratio, config.tracing_otlp_insecure) == (0.25, False)


def test_a_flag_wins_over_the_variable_and_the_variable_over_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = tmp_path / "udfserve.yaml"
    settings.write_text(
        "tracing_sample_ratio: 0.5\n"
        "tracing_service_name: from-file\n"
        "tracing_otlp_endpoint: http://file-collector:4317\n"
    )
    monkeypatch.setenv("UDFSERVE_TRACING_SAMPLE_RATIO", "0.2")
    monkeypatch.setenv("UDFSERVE_TRACING_SERVICE_NAME", "from-variable")

    config = serve_config(
        "--config", str(settings), "--model-repository", str(tmp_path), "--tracing-sample-ratio", "0.1"
    )

    assert config.tracing_sample_ratio == 0.1  # flag over variable and file
    assert config.tracing_service_name == "from-variable"  # variable over file
    assert config.tracing_otlp_endpoint == "http://file-collector:4317"  # the file over the default


def test_a_sample_ratio_outside_0_to_1_is_refused_naming_the_flag_and_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--tracing-sample-ratio / UDFSERVE_TRACING_SAMPLE_RATIO: .*1"):
        serve_config("--model-repository", str(tmp_path), "--tracing-sample-ratio", "1.5")


def test_a_file_value_out_of_bounds_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    settings = tmp_path / "udfserve.yaml"
    settings.write_text("tracing_sample_ratio: -1\n")
    with pytest.raises(SettingsError, match=rf"--config {settings}, key tracing_sample_ratio"):
        serve_config("--config", str(settings), "--model-repository", str(tmp_path))


def server_config_of(node: NodeConfig, device: DeviceSlot) -> ServerConfig:
    """What a server the node starts runs with, read from its command line as `udfserve serve` does."""
    command = server_command(
        serve_arguments(
            node.model_repository,
            device=device.device,
            ready_file=node.runtime_dir / "ready.json",
            extra_args=node.server_flags(device) + node.server_extra_args,
        )
    )
    return settings_from_args(ServerConfig, build_parser().parse_args(command[3:]))


def test_the_node_gives_every_server_its_tracing_settings(tmp_path: Path) -> None:
    node = node_config(
        "--model-repository", str(tmp_path),
        "--tracing-otlp-endpoint", "http://otel-collector:4317",
        "--no-tracing-otlp-insecure",
        "--tracing-sample-ratio", "0.01",
        "--tracing-service-name", "udfserve-node-a",
    )  # fmt: skip

    for device in (DeviceSlot("sim:0", index=0), DeviceSlot("sim:1", index=1)):
        server = server_config_of(node, device)
        assert server.tracing_otlp_endpoint == "http://otel-collector:4317"
        assert (server.tracing_otlp_insecure, server.tracing_sample_ratio) == (False, 0.01)
        assert (server.tracing_service_name, server.tracing_spans_file) == ("udfserve-node-a", None)


def test_a_node_whose_tracing_comes_from_the_environment_passes_it_as_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("UDFSERVE_TRACING_SPANS_FILE", str(tmp_path / "spans.jsonl"))
    node = node_config("--model-repository", str(tmp_path))
    monkeypatch.delenv("UDFSERVE_TRACING_SPANS_FILE")  # the server must get it from the node's flags

    server = server_config_of(node, DeviceSlot("cpu"))

    assert server.tracing_spans_file == tmp_path / "spans.jsonl" and server.tracing_enabled


def test_server_args_giving_a_tracing_flag_are_refused_naming_the_nodes(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError, match=r"--tracing-sample-ratio \(use the node's --tracing-sample-ratio"
    ):
        node_config("--model-repository", str(tmp_path), "--server-args=--tracing-sample-ratio 1")
