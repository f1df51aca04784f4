"""Typed configuration of the server process: flags and ``UDFSERVE_*`` variables.

Precedence: a command-line flag, then the ``UDFSERVE_<FIELD>`` environment variable, then the
default. Each model's ``config.yaml`` is the runtime's (``udfserve.runtime.model_config``).

``ServerConfig`` is one settings class composed of groups, each in a module of this package with
its own checks: the repository (``models``), the device and listeners (``listeners``), bounds
(``limits``), model calls and the process (``process``), security (``security``), application
scheduling (``scheduling``), and the admin app (``admin``). The checks that read several groups
(listeners beyond loopback and the security they need) are here.
"""

from __future__ import annotations

from pydantic import model_validator
from pydantic_settings import SettingsConfigDict

from udfserve.services.model_server.config.admin import MAX_TRACKED_APPS, AdminSettings
from udfserve.services.model_server.config.limits import LimitSettings
from udfserve.services.model_server.config.listeners import (
    ListenerSettings,
    SharedMemorySettings,
    is_loopback,
)
from udfserve.services.model_server.config.models import ModelSettings
from udfserve.services.model_server.config.process import CallSettings, ProcessSettings
from udfserve.services.model_server.config.scheduling import SchedulingSettings
from udfserve.services.model_server.config.security import SecuritySettings
from udfserve.services.model_server.shared_settings import SharedServerSettings

__all__ = ["MAX_TRACKED_APPS", "ServerConfig", "is_loopback"]


class ServerConfig(
    # pydantic orders the fields from the last base to the first, and --help, --config and shell
    # completion list them in that order: the groups are listed here last one first
    ProcessSettings,
    AdminSettings,
    SchedulingSettings,
    SecuritySettings,
    CallSettings,
    SharedMemorySettings,
    LimitSettings,
    ListenerSettings,
    ModelSettings,
    SharedServerSettings,
):
    """One model server process. Fields map to ``--flag-name`` and ``UDFSERVE_FLAG_NAME``."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _safe_listeners(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both --tls-cert-file and --tls-key-file")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("--tls-client-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file")
        if self.tls_cert_file is None and not self.allow_insecure_remote:
            remote = [
                f"{flag} {host}"
                for flag, host, port in (
                    ("--host", self.host, self.port),
                    ("--http-host", self.http_host, self.http_port),
                    ("--host", self.host, self.kserve_port),
                    ("--host", self.host, self.kserve_http_port),
                )
                if port is not None and not is_loopback(host)
            ]
            if remote:
                raise ValueError(
                    f"refusing a plaintext listener on a non-loopback address ({', '.join(remote)}): give "
                    "--tls-cert-file and --tls-key-file, or --allow-insecure-remote to accept it explicitly"
                )
        return self

    @model_validator(mode="after")
    def _authenticated_remote_inference(self) -> ServerConfig:
        """TLS proves the server to its clients, not the clients to the server: an inference
        listener beyond loopback needs a token or client certificates, or the operator's word."""
        authenticates = (
            self.auth_token is not None
            or self.auth_token_file is not None
            or self.tls_client_ca_file is not None
        )
        if not self.tls_enabled or authenticates or self.allow_unauthenticated_remote:
            return self
        remote = [
            f"--host {self.host} ({flag})"
            for flag, port in (
                ("--port", self.port),
                ("--kserve-port", self.kserve_port),
                ("--kserve-http-port", self.kserve_http_port),
            )
            if port is not None and not is_loopback(self.host)
        ]
        if remote:
            raise ValueError(
                f"refusing a TLS inference listener on a non-loopback address that authenticates no client "
                f"({', '.join(remote)}): anyone who reaches it could run the models; give --auth-token "
                "(or --auth-token-file) or --tls-client-ca-file, or --allow-unauthenticated-remote to "
                "accept it explicitly"
            )
        return self
