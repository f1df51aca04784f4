"""Settings of who may use a server and what it may load: TLS, the bearer token, the operator's
explicit consent to remote listeners, and whether SavedModels (graphs that may touch files) load."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator


class SecuritySettings(BaseModel):
    """TLS files, the token, and the consents that relax the checks on remote listeners."""

    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate chain: serve gRPC over TCP and HTTP over TLS"
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of --tls-cert-file")
    tls_client_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle: require client certificates it signed (mutual TLS)"
    )
    allow_insecure_remote: bool = Field(
        default=False,
        description="accept plaintext listeners on non-loopback addresses (the operator's explicit choice)",
    )
    allow_unauthenticated_remote: bool = Field(
        default=False,
        description="accept a TLS inference listener on a non-loopback --host that authenticates no client "
        "(neither --auth-token nor --tls-client-ca-file): anyone who reaches the port may run the models "
        "(the operator's explicit choice)",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="require 'authorization: Bearer <token>' for inference, model endpoints and "
        "/metrics (its labels name the Spark applications); health endpoints stay open",
    )
    auth_token_file: Path | None = Field(
        default=None, description="read the token from this file instead of --auth-token"
    )
    trust_savedmodels: bool = Field(
        default=True,
        description="serve TensorFlow SavedModels; a SavedModel's graph can read and write files with "
        "the server's permissions when it loads and runs, so --no-trust-savedmodels refuses them (Keras "
        "files are still served, loaded in safe mode) for a repository whose writers are not all trusted",
    )

    @field_validator("auth_token")
    @classmethod
    def _non_empty_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError(
                "expected a non-empty token: an empty one would turn the token check off (leave "
                "--auth-token out to run without one)"
            )
        return value

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def resolve_auth_token(self) -> str | None:
        """The token, read from --auth-token-file when given (read once, at start-up)."""
        if self.auth_token_file is not None:
            try:
                token = self.auth_token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"cannot read --auth-token-file {self.auth_token_file}: {exc}") from exc
            if not token:
                raise ValueError(f"--auth-token-file {self.auth_token_file} is empty")
            return token
        return self.auth_token.get_secret_value() if self.auth_token else None
