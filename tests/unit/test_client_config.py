"""ClientConfig: immutable, validated on construction, errors naming the field and the value."""

from __future__ import annotations

import pydantic
import pytest

from udfserve.spark_client.common.config import ClientConfig


def test_defaults_match_the_server_message_limit_and_fall_back_to_the_cpu() -> None:
    config = ClientConfig()
    assert config.max_message_bytes == 64 << 20
    assert config.fallback == "cpu"
    assert config.rows_per_request == 4096
    assert config.max_in_flight == 4
    assert config.prefer_unix_socket


def test_the_config_is_frozen() -> None:
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        ClientConfig().rows_per_request = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "address", ["unix:///run/udfserve/gpu0.sock", "localhost:7500", "10.1.2.3:7500", "[::1]:7500"]
)
def test_unix_sockets_and_host_port_are_valid_addresses(address: str) -> None:
    assert ClientConfig(address=address).address == address


@pytest.mark.parametrize("address", ["", "localhost", "/run/udfserve/gpu0.sock", "http://host:80"])
def test_an_address_gRPC_cannot_dial_is_refused_with_the_expected_forms(address: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="expected 'unix:///path/to/socket' or 'host:port'"):
        ClientConfig(address=address)


def test_an_unknown_fallback_policy_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="fallback"):
        ClientConfig(fallback="gpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["rows_per_request", "max_in_flight", "request_timeout_s", "connect_timeout_s"]
)
def test_sizes_and_timeouts_must_be_positive(field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        ClientConfig(**{field: 0})


def test_bytes_per_request_must_be_at_least_a_kibibyte() -> None:
    with pytest.raises(pydantic.ValidationError, match="bytes_per_request"):
        ClientConfig(bytes_per_request=1023)


def test_the_longest_back_off_cannot_be_shorter_than_the_first() -> None:
    with pytest.raises(
        pydantic.ValidationError, match=r"max_backoff_s \(0.01\) must be at least initial_backoff_s"
    ):
        ClientConfig(initial_backoff_s=0.5, max_backoff_s=0.01)


def test_unknown_settings_are_refused_naming_them() -> None:
    with pytest.raises(pydantic.ValidationError, match="rows_per_batch"):
        ClientConfig(rows_per_batch=10)  # type: ignore[call-arg]


def test_the_token_never_shows_in_the_config_s_text() -> None:
    config = ClientConfig(auth_token="very-secret-value")
    assert "very-secret-value" not in repr(config) and "very-secret-value" not in str(config)
    assert config.auth_token is not None and config.auth_token.get_secret_value() == "very-secret-value"


def test_a_token_and_a_token_file_together_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="auth_token or auth_token_file, not both"):
        ClientConfig(auth_token="t", auth_token_file="/run/secrets/token")


def test_a_client_certificate_without_its_key_is_refused_naming_both() -> None:
    with pytest.raises(pydantic.ValidationError, match="tls_client_certificate_file and tls_client_key_file"):
        ClientConfig(tls_client_certificate_file="/etc/udfserve/client.pem")


def test_any_tls_file_turns_tls_on_for_tcp() -> None:
    assert not ClientConfig().tls_enabled
    assert ClientConfig(tls_root_certificates_file="/etc/udfserve/ca.pem").tls_enabled


def test_the_circuit_may_probe_at_every_batch_but_not_before_it_opened() -> None:
    assert ClientConfig(circuit_reset_s=0).circuit_reset_s == 0
    with pytest.raises(pydantic.ValidationError, match="circuit_reset_s"):
        ClientConfig(circuit_reset_s=-1)
