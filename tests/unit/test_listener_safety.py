"""Listeners beyond loopback need TLS or the operator's explicit --allow-insecure-remote; inference
listeners beyond loopback also need a way to authenticate clients, or --allow-unauthenticated-remote."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from udfserve.services.model_server.config import ServerConfig, is_loopback
from udfserve.services.node.config import NodeConfig


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_addresses_are_recognised(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.org"])
def test_other_addresses_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_a_server_on_all_interfaces_without_tls_is_refused() -> None:
    with pytest.raises(ValidationError, match="--allow-insecure-remote"):
        ServerConfig(model_repository=Path("/m"), host="0.0.0.0")


def test_a_server_on_all_interfaces_is_accepted_when_the_operator_says_so() -> None:
    config = ServerConfig(model_repository=Path("/m"), host="0.0.0.0", allow_insecure_remote=True)
    assert config.host == "0.0.0.0"


TLS = {"tls_cert_file": Path("c.pem"), "tls_key_file": Path("k.pem")}


def test_a_server_on_all_interfaces_with_tls_and_a_token_is_accepted() -> None:
    config = ServerConfig(model_repository=Path("/m"), host="0.0.0.0", auth_token="t", **TLS)
    assert config.tls_enabled


def test_a_server_on_all_interfaces_with_tls_and_a_token_file_is_accepted() -> None:
    config = ServerConfig(model_repository=Path("/m"), host="0.0.0.0", auth_token_file=Path("t"), **TLS)
    assert config.tls_enabled


def test_a_server_on_all_interfaces_with_mutual_tls_is_accepted() -> None:
    config = ServerConfig(
        model_repository=Path("/m"), host="0.0.0.0", tls_client_ca_file=Path("ca.pem"), **TLS
    )
    assert config.tls_enabled


def test_a_server_on_all_interfaces_with_tls_authenticating_no_client_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationError) as raised:
        ServerConfig(model_repository=Path("/m"), host="0.0.0.0", **TLS)
    message = str(raised.value)
    assert "--host 0.0.0.0 (--port)" in message
    assert "authenticates no client" in message
    for choice in ("--auth-token", "--tls-client-ca-file", "--allow-unauthenticated-remote"):
        assert choice in message


def test_a_native_kserve_port_on_all_interfaces_authenticating_no_client_is_refused_too() -> None:
    with pytest.raises(ValidationError, match=r"--host 0\.0\.0\.0 \(--kserve-port\)"):
        ServerConfig(
            model_repository=Path("/m"),
            host="0.0.0.0",
            port=None,
            socket=Path("/s.sock"),
            kserve_frontend="native",
            kserve_port=0,
            **TLS,
        )


def test_a_kserve_http_port_on_all_interfaces_authenticating_no_client_is_refused_too() -> None:
    with pytest.raises(ValidationError, match=r"--host 0\.0\.0\.0 \(--kserve-http-port\)"):
        ServerConfig(
            model_repository=Path("/m"),
            host="0.0.0.0",
            port=None,
            socket=Path("/s.sock"),
            kserve_http_port=0,
            **TLS,
        )


def test_a_plaintext_kserve_http_port_on_all_interfaces_is_refused() -> None:
    with pytest.raises(ValidationError, match="--allow-insecure-remote"):
        ServerConfig(
            model_repository=Path("/m"), host="0.0.0.0", port=None, socket=Path("/s.sock"), kserve_http_port=0
        )


def test_a_server_on_all_interfaces_authenticating_no_client_is_accepted_when_the_operator_says_so() -> None:
    config = ServerConfig(
        model_repository=Path("/m"), host="0.0.0.0", allow_unauthenticated_remote=True, **TLS
    )
    assert config.allow_unauthenticated_remote


def test_a_server_on_loopback_with_tls_needs_no_client_authentication() -> None:
    assert ServerConfig(model_repository=Path("/m"), **TLS).tls_enabled


def test_a_tls_admin_app_beyond_loopback_with_inference_on_loopback_needs_no_client_authentication() -> None:
    assert ServerConfig(model_repository=Path("/m"), http_host="0.0.0.0", **TLS).tls_enabled


def test_a_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="both --tls-cert-file and --tls-key-file"):
        ServerConfig(model_repository=Path("/m"), tls_cert_file=Path("c.pem"))


def test_the_token_file_wins_and_is_stripped(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    config = ServerConfig(model_repository=Path("/m"), auth_token="other", auth_token_file=tmp_path / "token")
    assert config.resolve_auth_token() == "abc"


def test_a_node_exposing_its_servers_beyond_loopback_needs_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"--server-http-host 0\.0\.0\.0"):
        NodeConfig(model_repository=tmp_path, runtime_dir=tmp_path / "rt", server_http_host="0.0.0.0")


def test_a_node_with_tls_servers_still_keeps_its_own_http_app_on_loopback(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="--supervisor-http-host"):
        NodeConfig(
            model_repository=tmp_path,
            runtime_dir=tmp_path / "rt",
            server_http_host="0.0.0.0",
            supervisor_http_host="0.0.0.0",
            server_args="--tls-cert-file c.pem --tls-key-file k.pem",
        )
