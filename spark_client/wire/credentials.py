"""What the client proves to a server: TLS credentials for TCP channels and the bearer token.

Files (token, certificates, key) are read where the call is made, at task time on the executor
and when the UDF is built in the driver, never shipped inside the UDF: a Kubernetes secret or a
file deployed to every node stays where it is. A token given as a value (``auth_token``, or the
Spark conf ``spark.udfserve.authToken``) travels inside the UDF in ``TaskConfig.auth_token``, which
no log line or ``repr`` shows.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from udfserve.spark_client.common.errors import ClientSetupError
from udfserve.spark_client.common.task_config import TaskConfig

AUTHORIZATION_KEY = "authorization"
CallMetadata = tuple[tuple[str, str], ...]
"""gRPC call metadata: the headers of one call, as grpcio takes them ((key, value) pairs)."""


def auth_metadata(config: TaskConfig) -> CallMetadata:
    """``authorization: Bearer <token>`` when a token is configured, else nothing."""
    if config.auth_token is not None:
        token = config.auth_token.strip()
    elif config.auth_token_file is not None:
        token = _read(config.auth_token_file, "auth_token_file").decode("utf-8", errors="replace").strip()
        if not token:
            raise ClientSetupError(f"auth_token_file {config.auth_token_file} is empty; expected the token")
    else:
        return ()
    if not token.isascii() or not token.isprintable():
        raise ClientSetupError(
            "the auth token holds characters gRPC metadata cannot carry (printable ASCII only)"
        )
    return ((AUTHORIZATION_KEY, f"Bearer {token}"),)


def uses_tls(target: str, config: TaskConfig) -> bool:
    """TLS for TCP targets when configured; a unix socket is local and protected by its file mode."""
    return config.tls_enabled and not target.startswith(("unix:", "unix-abstract:"))


def channel_credentials(config: TaskConfig) -> grpc.ChannelCredentials:
    """TLS credentials from the configured files; the system's CAs when no root file is given."""
    root = _read_optional(config.tls_root_certificates_file, "tls_root_certificates_file")
    certificate = _read_optional(config.tls_client_certificate_file, "tls_client_certificate_file")
    key = _read_optional(config.tls_client_key_file, "tls_client_key_file")
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=certificate
    )


def _read_optional(path: str | None, field: str) -> bytes | None:
    return None if path is None else _read(path, field)


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ClientSetupError(f"cannot read {field} {path} on this host: {exc}") from exc
