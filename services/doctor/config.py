"""The doctor's settings: where the node is, what the client here would send, how long to wait.

Precedence as for ``serve`` and ``node``: a flag, then the ``UDFSERVE_<FIELD>`` variable, then
the default. The variables are on purpose the ones the node, the servers and the Spark client
read (``UDFSERVE_RUNTIME_DIR``, ``UDFSERVE_DISCOVERY_FILE``, ``UDFSERVE_AUTH_TOKEN_FILE``,
``UDFSERVE_SHARED_MEMORY_DIR``), so the doctor run in an environment looks where that
environment's node and executors look.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from udfserve.discovery import DISCOVERY_FILE_ENV, RUNTIME_DIR_ENV, default_discovery_path
from udfserve.shared_memory import DEFAULT_DIRECTORY as DEFAULT_SHARED_MEMORY_DIRECTORY


class DoctorConfig(BaseSettings):
    """One run of ``udfserve doctor``. Fields map to ``--flag-name`` and ``UDFSERVE_FLAG_NAME``."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="ignore", frozen=True)

    runtime_dir: Path | None = Field(
        default=None,
        description="the node's runtime folder (default: /tmp/udfserve-<uid>, as the node and the client "
        "choose it)",
    )
    discovery_file: Path | None = Field(
        default=None, description="the node's discovery file (default: <runtime dir>/discovery.json)"
    )
    trusted_node_uids: Annotated[tuple[int, ...], NoDecode] = Field(
        default=(),
        description="uids besides this user and root whose node files to believe, as the jobs' "
        "spark.udfserve.trustedNodeUids (a node run by a service user), comma separated",
    )
    auth_token_file: Path | None = Field(
        default=None,
        description="the token file the jobs send (spark.udfserve.authTokenFile); checked, then sent "
        "to every server",
    )
    auth_token: SecretStr | None = Field(
        default=None, description="the token itself, when the jobs give it as a value (never printed)"
    )
    shared_memory_dir: Path | None = Field(
        default=Path(DEFAULT_SHARED_MEMORY_DIRECTORY),
        description="the folder the jobs put shared-memory payloads in (spark.udfserve.sharedMemoryDir); "
        "'off' when they use none",
    )
    shared_memory_min_free_bytes: int = Field(
        default=16 << 20,
        ge=0,
        description="less free space than this in the shared-memory folder is reported: a payload file "
        "that cannot be reserved travels inline (a stream's files take a few MiB: its requests in flight, "
        "2 MiB each by default, and their answers)",
    )
    import_frameworks: bool = Field(
        default=True,
        description="import each installed framework in a child process to prove it loads (TensorFlow "
        "takes seconds); --no-import-frameworks only looks whether each is installed",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="time limit of each call to a server")

    @field_validator("trusted_node_uids", mode="before")
    @classmethod
    def _uids(cls, value: object) -> object:
        if isinstance(value, str):
            words = [word.strip() for word in value.split(",") if word.strip()]
            if not all(word.isdigit() for word in words):
                raise ValueError(f"expected uids as numbers separated by commas, received {value!r}")
            return tuple(int(word) for word in words)
        return value

    @field_validator("shared_memory_dir", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in {"off", "none", ""}:
            return None
        return value

    @model_validator(mode="after")
    def _one_token(self) -> DoctorConfig:
        if self.auth_token is not None and self.auth_token_file is not None:
            raise ValueError("give auth_token or auth_token_file, not both")
        return self

    @property
    def discovery_path(self) -> Path:
        """The discovery file, found as the node writes it and the client reads it (the settings
        took the variables in already)."""
        given: dict[str, str] = {}
        if self.runtime_dir is not None:
            given[RUNTIME_DIR_ENV] = str(self.runtime_dir)
        if self.discovery_file is not None:
            given[DISCOVERY_FILE_ENV] = str(self.discovery_file)
        return default_discovery_path(given)

    @property
    def runtime_folder(self) -> Path:
        """The node's runtime folder (its lock and sockets): the one named, else the discovery
        file's folder."""
        return self.runtime_dir if self.runtime_dir is not None else self.discovery_path.parent
