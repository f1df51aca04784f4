"""The settings a Spark task runs with: ``ClientConfig``'s values, already validated, without pydantic.

The driver validates what the user gives in ``ClientConfig`` (pydantic, ``config.py``) and the
UDF's closure carries ``ClientConfig.task_config()``, this plain frozen dataclass of the same
fields. Unpickling a pydantic model imports pydantic, about 15 MiB of resident memory and a
second of imports in every Python worker (docs/benchmarks.md, "What each import adds in a
worker"), for values that were checked once already. Everything that runs in a task (``wire/``,
``nodes/``, ``observability/``, ``executor/``) reads this type; the field descriptions live in
``ClientConfig``, and a unit test keeps the two field lists the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from udfserve.spark_client.common.node_start import NodeStart

_TARGET_PATTERN = re.compile(
    r"^(unix:|unix-abstract:|dns:|ipv4:|ipv6:|[^\s/:]+:\d+$|\[[0-9a-fA-F:.]+\]:\d+$)"
)


def check_target(value: str, what: str) -> str:
    """Refuse what gRPC could not dial: a unix socket URI or ``host:port``."""
    value = value.strip()
    if not value or not _TARGET_PATTERN.match(value):
        raise ValueError(
            f"{what} {value!r} is not a gRPC target; expected 'unix:///path/to/socket' or 'host:port'"
        )
    return value


@dataclass(frozen=True)
class TaskConfig:
    """``ClientConfig``'s fields, as a task reads them; build it with ``ClientConfig.task_config()``.

    ``auth_token`` is the token's text, left out of ``repr`` (and so of logs and tracebacks), as
    ``ClientConfig`` keeps it in a ``SecretStr``."""

    address: str | None
    protocol: Literal["arrow", "kserve"]
    discovery_file: str | None
    priority_class: str | None
    trusted_node_uids: tuple[int, ...]
    fallback_repository_from_node: bool
    model_version: int
    version_consistency: Literal["job", "request"]
    when_pinned_version_gone: Literal["fail", "follow"]
    rows_per_request: int
    bytes_per_request: int
    max_in_flight: int
    request_timeout_s: float
    connect_timeout_s: float
    fallback: Literal["cpu", "error"]
    model_repository: str | None
    max_message_bytes: int
    initial_backoff_s: float
    max_backoff_s: float
    max_retry_time_s: float
    prefer_unix_socket: bool
    shared_memory: bool
    shared_memory_dir: str
    shared_memory_group_access: bool
    circuit_reset_s: float
    auth_token: str | None = field(repr=False)
    auth_token_file: str | None
    tls_root_certificates_file: str | None
    tls_server_name: str | None
    tls_client_certificate_file: str | None
    tls_client_key_file: str | None
    trace_sample_ratio: float
    traceparent: str | None
    node_start: NodeStart | None

    @property
    def tls_enabled(self) -> bool:
        """TCP channels use TLS when any TLS setting is given; unix sockets stay plaintext (local only)."""
        return any(
            f is not None
            for f in (
                self.tls_root_certificates_file,
                self.tls_client_certificate_file,
                self.tls_client_key_file,
                self.tls_server_name,
            )
        )
