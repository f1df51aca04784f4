"""Settings of `udfserve node`: flags, UDFSERVE_* variables, where its files go."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from udfserve.discovery import default_discovery_path
from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.launcher import serve_arguments, server_command
from udfserve.services.model_server.shared_settings import SHARED_SETTINGS
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot
from udfserve.services.settings_cli import SettingsError, add_settings_arguments, settings_from_args


def parse(argv: list[str]) -> NodeConfig:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, NodeConfig)
    return settings_from_args(NodeConfig, parser.parse_args(argv))


def test_the_discovery_file_is_where_the_spark_client_looks_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_RUNTIME_DIR", str(tmp_path / "rt"))

    config = parse(["--model-repository", str(tmp_path)])

    assert config.runtime_dir == tmp_path / "rt"
    assert config.discovery_path == default_discovery_path({"UDFSERVE_RUNTIME_DIR": str(tmp_path / "rt")})
    assert config.lock_path == tmp_path / "rt" / "node.lock"
    assert config.targets_path == tmp_path / "rt" / "prometheus-targets.json"


def test_a_discovery_file_flag_wins_over_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_DISCOVERY_FILE", str(tmp_path / "from-env.json"))

    config = parse(["--model-repository", str(tmp_path), "--discovery-file", str(tmp_path / "flag.json")])

    assert config.discovery_path == tmp_path / "flag.json"


def test_devices_come_from_the_variable_when_no_flag_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_DEVICES", "sim:0, sim:1")

    assert parse(["--model-repository", str(tmp_path)]).devices == "sim:0,sim:1"


def test_invalid_devices_are_refused_naming_the_flag_and_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--devices / UDFSERVE_DEVICES: .*invalid --devices 'gpu0'"):
        parse(["--model-repository", str(tmp_path), "--devices", "gpu0"])


def test_a_missing_model_repository_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"model repository .*missing is not a folder"):
        parse(["--model-repository", str(tmp_path / "missing")])


def test_a_runtime_dir_too_long_for_unix_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="too long for unix socket paths"):
        parse(["--model-repository", str(tmp_path), "--runtime-dir", "/tmp/" + "r" * 100])


def test_server_ports_default_to_free_ports_and_tcp_can_be_turned_off(tmp_path: Path) -> None:
    config = parse(["--model-repository", str(tmp_path), "--server-port-base", "off"])

    assert config.server_port_base is None
    assert config.server_http_port_base == 0


def test_server_args_are_split_like_a_shell(tmp_path: Path) -> None:
    config = parse(["--model-repository", str(tmp_path), "--server-args=--inference-threads 2"])

    assert config.server_extra_args == ["--inference-threads", "2"]


def test_a_staleness_bound_under_two_heartbeats_is_refused_naming_both(tmp_path: Path) -> None:
    """A heartbeat written a little late must not make readers drop a live node."""
    with pytest.raises(
        SettingsError,
        match=r"discovery_stale_after_s \(3.0\) must be at least twice discovery_heartbeat_s \(2.0\)",
    ):
        parse(
            [
                "--model-repository",
                str(tmp_path),
                "--discovery-heartbeat-s",
                "2",
                "--discovery-stale-after-s",
                "3",
            ]
        )


def server_config_of(node: NodeConfig, device: DeviceSlot) -> ServerConfig:
    """The settings a server started by this node runs with, read from its command line as
    `udfserve serve` reads it (the node's flags, then --server-args)."""
    command = server_command(
        serve_arguments(
            node.model_repository,
            device=device.device,
            ready_file=node.runtime_dir / "ready.json",
            extra_args=node.server_flags(device) + node.server_extra_args,
        )
    )
    assert command[3] == "serve", command
    return settings_from_args(ServerConfig, build_parser().parse_args(command[3:]))


def test_every_server_runs_with_the_nodes_model_control(tmp_path: Path) -> None:
    node = parse(
        [
            "--model-repository", str(tmp_path),
            "--model-control", "poll",
            "--repository-poll-s", "0.5",
            "--repository-settle-s", "1",
            "--version-swap", "unload-first",
            "--version-drain-s", "7",
        ]
    )  # fmt: skip

    for device in (DeviceSlot("sim:0", index=0), DeviceSlot("sim:1", index=1)):
        server = server_config_of(node, device)
        assert (server.model_control, server.repository_poll_s, server.repository_settle_s) == (
            "poll",
            0.5,
            1.0,
        )
        assert (server.version_swap, server.version_drain_s) == ("unload-first", 7.0)


def test_model_control_is_the_same_variable_for_the_node_and_its_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_MODEL_CONTROL", "explicit")
    monkeypatch.setenv("UDFSERVE_VERSION_DRAIN_S", "12")

    node = parse(["--model-repository", str(tmp_path)])
    monkeypatch.delenv("UDFSERVE_MODEL_CONTROL")  # the server must get it from the node's flags
    monkeypatch.delenv("UDFSERVE_VERSION_DRAIN_S")
    server = server_config_of(node, DeviceSlot("cpu"))

    assert (node.model_control, node.version_drain_s) == ("explicit", 12.0)
    assert (server.model_control, server.version_drain_s) == ("explicit", 12.0)


def test_the_nodes_log_format_is_every_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UDFSERVE_LOG_FORMAT", "json")

    node = parse(["--model-repository", str(tmp_path)])
    monkeypatch.delenv("UDFSERVE_LOG_FORMAT")  # the server must get it from the node's flags
    server = server_config_of(node, DeviceSlot("cpu"))

    assert (node.log_format, server.log_format) == ("json", "json")


def test_a_log_format_other_than_text_or_json_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--log-format / UDFSERVE_LOG_FORMAT: .*'text' or 'json'"):
        parse(["--model-repository", str(tmp_path), "--log-format", "logfmt"])


@pytest.mark.parametrize("name", SHARED_SETTINGS)
def test_a_setting_the_node_passes_on_has_the_servers_type_default_and_bounds(name: str) -> None:
    node_field, server_field = NodeConfig.model_fields[name], ServerConfig.model_fields[name]

    assert node_field.annotation == server_field.annotation
    assert node_field.get_default() == server_field.get_default()
    assert node_field.metadata == server_field.metadata


@pytest.mark.parametrize(
    ("server_args", "refusal"),
    [
        (
            "--model-control poll",
            r"--model-control \(use the node's --model-control or UDFSERVE_MODEL_CONTROL\)",
        ),
        ("--repository-settle-s=0", r"--repository-settle-s \(use the node's --repository-settle-s"),
        ("--model-cont poll", r"--model-control \(use the node's --model-control"),  # as argparse abbreviates
        ("--grace-period-s 60", r"--grace-period-s \(use the node's --grace-period-s"),
        ("--device gpu:1", r"--device \(use the node's --devices\)"),
        ("--port 7500", r"--port \(use the node's --server-port-base\)"),
    ],
)
def test_server_args_giving_a_flag_the_node_sets_are_refused_naming_the_nodes_flag(
    tmp_path: Path, server_args: str, refusal: str
) -> None:
    with pytest.raises(SettingsError, match=r"--server-args / UDFSERVE_SERVER_ARGS: .*" + refusal):
        parse(["--model-repository", str(tmp_path), f"--server-args={server_args}"])


def test_server_args_the_node_does_not_set_reach_every_server(tmp_path: Path) -> None:
    node = parse(
        ["--model-repository", str(tmp_path), "--server-args=--inference-threads 3 --socket-mode 0660"]
    )

    server = server_config_of(node, DeviceSlot("cpu"))

    assert (server.inference_threads, server.socket_mode) == (3, "0660")
