"""`udfserve node` reads the command line of every server it would start as `udfserve serve` reads
it, before starting anything: a server configuration that `serve` refuses stops the node at once
(exit 2, the server's message), instead of servers exiting at every restart."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from certificates import make_pki

from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot
from udfserve.services.node.server_flags import check_server_command
from udfserve.services.node.supervisor import ServerSlot
from udfserve.services.settings_cli import add_settings_arguments, settings_from_args


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("node-pki"))


def node_config(*argv: str) -> NodeConfig:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, NodeConfig)
    return settings_from_args(NodeConfig, parser.parse_args(list(argv)))


def server_arguments(config: NodeConfig) -> list[str]:
    return ServerSlot(DeviceSlot(device="cpu", index=None), 0, config).serve_arguments(config)


def tls_server_args(pki: Path, *more: str) -> str:
    return "--server-args=" + " ".join(
        ["--tls-cert-file", str(pki / "server.pem"), "--tls-key-file", str(pki / "server.key"), *more]
    )


def run_node(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "udfserve", "node", "--model-repository", str(tmp_path)]
    command += ["--devices", "cpu", "--runtime-dir", str(tmp_path / "rt"), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_a_node_whose_servers_would_refuse_tls_that_authenticates_no_client_refuses_to_start(
    tmp_path: Path, pki: Path
) -> None:
    finished = run_node(tmp_path, "--server-host", "0.0.0.0", tls_server_args(pki))

    assert finished.returncode == 2, finished.stderr
    assert "refusing to start: the model server on cpu would refuse its settings" in finished.stderr
    assert "--allow-unauthenticated-remote to accept it explicitly" in finished.stderr
    assert not (tmp_path / "rt" / "logs").exists()  # no server was started


def test_a_node_whose_servers_would_not_find_their_token_file_refuses_to_start(tmp_path: Path) -> None:
    finished = run_node(tmp_path, f"--server-args=--auth-token-file {tmp_path / 'missing'}")

    assert finished.returncode == 2, finished.stderr
    assert f"cannot read --auth-token-file {tmp_path / 'missing'}" in finished.stderr
    assert not (tmp_path / "rt" / "logs").exists()


def test_remote_tls_servers_with_a_token_pass_the_check(tmp_path: Path, pki: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    config = node_config(
        "--model-repository",
        str(tmp_path),
        "--server-host",
        "0.0.0.0",
        tls_server_args(pki, "--auth-token-file", str(tmp_path / "token")),
    )

    server = check_server_command(server_arguments(config))

    assert server.host == "0.0.0.0" and server.auth_token_file == tmp_path / "token"


def test_remote_tls_servers_the_operator_accepts_unauthenticated_pass_the_check(
    tmp_path: Path, pki: Path
) -> None:
    config = node_config(
        "--model-repository",
        str(tmp_path),
        "--server-host",
        "0.0.0.0",
        tls_server_args(pki, "--allow-unauthenticated-remote"),
    )

    assert check_server_command(server_arguments(config)).allow_unauthenticated_remote


def test_the_servers_of_a_node_of_default_settings_pass_the_check(tmp_path: Path) -> None:
    config = node_config("--model-repository", str(tmp_path))

    server = check_server_command(server_arguments(config))

    assert server.device == "cpu" and server.host == "127.0.0.1"


def test_a_flag_serve_does_not_have_is_refused_naming_it(tmp_path: Path) -> None:
    config = node_config("--model-repository", str(tmp_path), "--server-args=--no-such-flag 1")

    with pytest.raises(ValueError, match="unrecognized arguments: --no-such-flag 1"):
        check_server_command(server_arguments(config))
