"""The server's token and TLS files, checked before it starts; secrets never echoed in errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from certificates import make_pki
from pydantic import ValidationError

from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.security import check_credentials
from udfserve.services.settings_cli import SettingsError, settings_from_args


def serve_config(*argv: str) -> ServerConfig:
    return settings_from_args(
        ServerConfig, build_parser().parse_args(["serve", "--model-repository", "/m", *argv])
    )


def test_an_error_across_settings_never_echoes_the_token() -> None:
    with pytest.raises(SettingsError) as refused:
        serve_config("--auth-token", "TOPSECRET123", "--host", "0.0.0.0")
    assert "--allow-insecure-remote" in str(refused.value)
    assert "TOPSECRET123" not in str(refused.value)


def test_an_empty_token_is_refused_without_echoing_it() -> None:
    with pytest.raises(SettingsError) as refused:
        serve_config("--auth-token", " ")
    assert "--auth-token / UDFSERVE_AUTH_TOKEN: Value error, expected a non-empty token" in str(refused.value)
    assert "(received (hidden))" in str(refused.value)


def test_an_empty_token_never_turns_the_check_off_silently() -> None:
    with pytest.raises(ValidationError, match="would turn the token check off"):
        ServerConfig(model_repository=Path("/m"), auth_token="")


def test_a_token_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-token"
    with pytest.raises(ValueError, match=f"cannot read --auth-token-file {missing}"):
        check_credentials(ServerConfig(model_repository=Path("/m"), auth_token_file=missing))


def test_a_missing_tls_file_is_named_with_its_flag(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    config = ServerConfig(
        model_repository=Path("/m"), tls_cert_file=pki / "server.pem", tls_key_file=tmp_path / "missing.key"
    )
    with pytest.raises(
        ValueError, match=f"--tls-key-file {tmp_path / 'missing.key'}: expected a readable PEM file"
    ):
        check_credentials(config)


def test_a_file_that_is_not_a_certificate_is_named_as_such_not_as_a_port(tmp_path: Path) -> None:
    garbage = tmp_path / "bad.pem"
    garbage.write_text("garbage\n")
    config = ServerConfig(model_repository=Path("/m"), tls_cert_file=garbage, tls_key_file=garbage)
    with pytest.raises(ValueError, match=r"expected a PEM certificate \(chain\) and its private key"):
        check_credentials(config)


def mutual_tls(pki: Path, client_ca: Path, **settings: object) -> ServerConfig:
    """A server of ``pki``'s certificate and key, requiring clients signed by ``client_ca``."""
    return ServerConfig.model_validate(
        {
            "model_repository": "/m",
            "tls_cert_file": pki / "server.pem",
            "tls_key_file": pki / "server.key",
            "tls_client_ca_file": client_ca,
            **settings,
        }
    )


def test_a_client_ca_that_is_not_a_certificate_is_named(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    (tmp_path / "ca-bad.pem").write_text("not a CA\n")
    with pytest.raises(ValueError, match=r"--tls-client-ca-file .*expected PEM CA certificates"):
        check_credentials(mutual_tls(pki, tmp_path / "ca-bad.pem"))


def test_valid_tls_files_and_token_file_pass(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    (tmp_path / "token").write_text("t0ken\n")
    check_credentials(mutual_tls(pki, pki / "ca.pem", auth_token_file=tmp_path / "token"))
