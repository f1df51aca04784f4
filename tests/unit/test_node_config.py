"""Settings of `udfserve node`: flags, UDFSERVE_* variables, where its files go."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.node.config import NodeConfig
from services.settings_cli import SettingsError, add_settings_arguments, settings_from_args
from udfserve.discovery import default_discovery_path


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
