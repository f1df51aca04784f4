"""The token and TLS files: read where the call is made, refused clearly when unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ClientSetupError
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.credentials import auth_metadata, channel_credentials, uses_tls


def task_config(**values: object) -> TaskConfig:
    """The settings a task reads: validated in ``ClientConfig``, carried as ``TaskConfig``."""
    return ClientConfig(**values).task_config()  # type: ignore[arg-type]


def test_no_token_sends_no_authorization() -> None:
    assert auth_metadata(task_config()) == ()


def test_a_token_is_sent_as_a_bearer_authorization() -> None:
    assert auth_metadata(task_config(auth_token="abc")) == (("authorization", "Bearer abc"),)


def test_a_token_file_is_read_and_stripped_when_the_call_is_made(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    config = task_config(auth_token_file=str(token_file))
    token_file.write_text("first\n")
    assert auth_metadata(config) == (("authorization", "Bearer first"),)
    token_file.write_text("second\n")
    assert auth_metadata(config) == (("authorization", "Bearer second"),)


def test_an_unreadable_token_file_names_the_setting_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(ClientSetupError, match=f"cannot read auth_token_file {missing}"):
        auth_metadata(task_config(auth_token_file=str(missing)))


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ClientSetupError, match="is empty"):
        auth_metadata(task_config(auth_token_file=str(tmp_path / "token")))


def test_a_token_gRPC_cannot_carry_is_refused_without_showing_it() -> None:
    with pytest.raises(ClientSetupError, match="printable ASCII") as raised:
        auth_metadata(task_config(auth_token="s\u00e9cret"))
    assert "s\u00e9cret" not in str(raised.value)


def test_tls_applies_to_tcp_targets_and_never_to_unix_sockets() -> None:
    config = task_config(tls_root_certificates_file="/etc/ca.pem")
    assert uses_tls("10.0.0.1:7500", config)
    assert not uses_tls("unix:///run/udfserve/gpu0.sock", config)
    assert not uses_tls("10.0.0.1:7500", task_config())


def test_an_unreadable_certificate_names_the_setting(tmp_path: Path) -> None:
    config = task_config(tls_root_certificates_file=str(tmp_path / "ca.pem"))
    with pytest.raises(ClientSetupError, match="cannot read tls_root_certificates_file"):
        channel_credentials(config)


def test_a_token_travels_to_the_tasks_as_its_text_and_no_repr_shows_it() -> None:
    config = task_config(auth_token="abc-secret")
    assert config.auth_token == "abc-secret"
    assert "abc-secret" not in repr(config)
