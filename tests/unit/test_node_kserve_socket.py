"""A node gives each server a KServe socket in its runtime folder (``kserve-<device>.sock``) where its
``--server-args`` ask for the native KServe front end: executors in other containers reach the
servers only through that folder. Without the ask the servers run as they always did."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot
from udfserve.services.node.server_flags import check_server_command
from udfserve.services.node.supervisor import ServerSlot
from udfserve.services.settings_cli import add_settings_arguments, settings_from_args

SHIPPED = "--server-args=--kserve-frontend auto --kserve-port 0"


def node_config(tmp_path: Path, *argv: str) -> NodeConfig:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, NodeConfig)
    arguments = ["--model-repository", str(tmp_path), "--runtime-dir", str(tmp_path / "rt"), *argv]
    return settings_from_args(NodeConfig, parser.parse_args(arguments))


def server_arguments(config: NodeConfig) -> list[str]:
    return ServerSlot(DeviceSlot(device="cpu", index=None), 0, config).serve_arguments(config)


def kserve_socket_of(arguments: list[str]) -> str | None:
    return arguments[arguments.index("--kserve-socket") + 1] if "--kserve-socket" in arguments else None


def test_the_shipped_server_args_give_each_server_a_kserve_socket_in_the_runtime_folder(
    tmp_path: Path,
) -> None:
    config = node_config(tmp_path, SHIPPED)

    arguments = server_arguments(config)

    assert kserve_socket_of(arguments) == str(config.runtime_dir / "kserve-cpu.sock")
    server = check_server_command(arguments)
    assert (server.kserve_frontend, server.kserve_port) == ("auto", 0)


def test_the_native_front_end_without_a_port_gets_the_socket_alone(tmp_path: Path) -> None:
    arguments = server_arguments(node_config(tmp_path, "--server-args=--kserve-frontend native"))

    server = check_server_command(arguments)

    assert server.kserve_port is None and server.kserve_socket == tmp_path / "rt" / "kserve-cpu.sock"


def test_the_native_front_end_asked_for_by_the_environment_gets_the_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_KSERVE_FRONTEND", "native")

    assert kserve_socket_of(server_arguments(node_config(tmp_path))) is not None


@pytest.mark.parametrize(
    "server_args",
    [None, "--server-args=--kserve-frontend python", "--server-args=--kserve-frontend auto"],
)
def test_servers_not_asking_for_the_native_front_end_get_no_kserve_socket(
    tmp_path: Path, server_args: str | None
) -> None:
    config = node_config(tmp_path, *([server_args] if server_args else []))

    assert kserve_socket_of(server_arguments(config)) is None


def test_a_kserve_socket_in_the_server_args_is_refused_naming_the_runtime_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--kserve-socket \(use the node's --runtime-dir"):
        node_config(tmp_path, "--server-args=--kserve-frontend native --kserve-socket /tmp/k.sock")
