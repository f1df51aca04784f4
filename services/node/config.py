"""Settings of the node supervisor (``udfserve node``).

Precedence: a command-line flag, then the ``UDFSERVE_<FIELD>`` environment variable, then the
default. The prefix is the one ``udfserve serve`` uses, on purpose: the variables both
commands share mean the same thing (``UDFSERVE_MODEL_REPOSITORY``, ``UDFSERVE_MODELS``,
``UDFSERVE_GRACE_PERIOD_S``, ``UDFSERVE_LOG_LEVEL``, ``UDFSERVE_MODEL_CONTROL`` and the other
model-lifecycle settings, which the node passes to every server: ``server_flags.py``), and
``UDFSERVE_RUNTIME_DIR`` and ``UDFSERVE_DISCOVERY_FILE`` are the very variables the Spark
client reads to find the discovery file, so a node and its executors configured from one
environment agree. Fields
that only the supervisor has are named so that they cannot be mistaken for a server's
(``server_port_base``, ``supervisor_http_port``, ...).
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from udfserve.discovery import (
    DISCOVERY_FILE_ENV,
    RUNTIME_DIR_ENV,
    default_discovery_path,
    default_runtime_dir,
)
from udfserve.fallback_reports import FALLBACK_REPORTS_DIR_NAME
from udfserve.services.model_server.config import ServerConfig, is_loopback
from udfserve.services.model_server.config.models import ModelNames
from udfserve.services.model_server.shared_settings import SHARED_SETTINGS, SharedServerSettings
from udfserve.services.node.devices import DeviceError, DeviceSlot, check_devices_syntax
from udfserve.services.node.runtime_dir import PRIVATE_MODE, SHARED_MODE
from udfserve.services.node.server_flags import NODE_SET_FLAGS, check_server_args
from udfserve.services.settings_cli import flag_name

UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
LONGEST_SOCKET_NAME = len("server-sim999.sock") + 1


def _port_or_off(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() in {"off", "none", ""}:
        return None
    return value


class NodeConfig(SharedServerSettings):
    """One node supervisor. Fields map to ``--flag-name`` and ``UDFSERVE_FLAG_NAME``."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="forbid", frozen=True)

    @staticmethod
    def file_key_hint(name: str) -> str | None:
        """For a node's ``--config`` file naming one of ``udfserve serve``'s own settings: where the
        node takes it from (its own setting for those it sets on every server, ``server_args`` for
        the others); None for a name no server has (``settings_file``)."""
        if name in NODE_SET_FLAGS:
            return f"the node sets it on every server itself, from {NODE_SET_FLAGS[name]}"
        if name in ServerConfig.model_fields:
            return (
                f"it is a setting of each server; expected it in server_args "
                f"(server_args: --{name.replace('_', '-')} VALUE)"
            )
        return None

    model_repository: Path = Field(description="model repository every server loads")
    models: ModelNames = Field(
        default=(), description="load only these models, comma separated (default: all)"
    )
    devices: str = Field(
        default="auto",
        description='"auto" (a server per NVIDIA GPU, else one on the CPU), "cpu", GPU indices "0,1", '
        'or simulated devices "sim:0,sim:1" (CPU processes announced as GPUs 0 and 1)',
    )
    runtime_dir: Path = Field(
        default_factory=default_runtime_dir,
        description="folder of the lock, the servers' unix sockets and logs, the Prometheus targets file. "
        "The default, /tmp/udfserve-<uid>, is created 0700; a folder named here is created 0755. A folder "
        "that exists must belong to the node's user and be writable by nobody else (the node refuses it "
        "otherwise)",
    )
    discovery_file: Path | None = Field(
        default=None, description="where to write the discovery file (default: <runtime dir>/discovery.json)"
    )
    node_name: str = Field(default="", description="node label in discovery and metrics (default: host name)")
    server_host: str = Field(default="127.0.0.1", description="host the servers' gRPC TCP listeners bind")
    server_port_base: int | None = Field(
        default=0,
        ge=0,
        le=65535,
        description="gRPC TCP port: 0 lets each server pick a free one, N gives server i port N+i, "
        "off: unix sockets only",
    )
    server_http_host: str = Field(default="127.0.0.1", description="host the servers' HTTP admin apps bind")
    server_http_port_base: int = Field(
        default=0, ge=0, le=65535, description="HTTP admin port: 0 picks free ports, N gives server i N+i"
    )
    supervisor_http_host: str = Field(default="127.0.0.1", description="host of the supervisor's HTTP app")
    supervisor_http_port: int = Field(
        default=7490, ge=0, le=65535, description="port of the supervisor's /metrics and /health (0: free)"
    )
    advertise_host: str | None = Field(
        default=None,
        description="host written into the Prometheus targets file (default: the bound host, or "
        "the host name when bound to 0.0.0.0)",
    )
    discovery_heartbeat_s: float = Field(
        default=2.0,
        gt=0,
        description="rewrite the discovery file at least this often (seconds), so that readers can tell "
        "a live node from the file of a killed one",
    )
    discovery_stale_after_s: float = Field(
        default=10.0,
        gt=0,
        description="readers take a discovery file older than this (seconds) for absent: the supervisor "
        "and its servers are gone; at least twice --discovery-heartbeat-s",
    )
    start_timeout_s: float = Field(default=180.0, gt=0, description="time a server has to become ready")
    restart_backoff_initial_s: float = Field(
        default=1.0, ge=0, description="delay before the first restart of a server that died"
    )
    restart_backoff_max_s: float = Field(default=60.0, ge=0, description="the delay doubles up to this")
    restart_backoff_reset_s: float = Field(
        default=300.0,
        ge=0,
        description="a server that was ready this long before it died restarts after the initial delay",
    )
    server_args: str = Field(
        default="",
        description="more `udfserve serve` flags for every server, given with '=', e.g. "
        "--server-args='--inference-threads 2'; a flag the node sets itself (one of its own, such as "
        "--model-control, or a server's device, socket, ports) is refused, and so is, before any "
        "server starts, a server command line that `udfserve serve` would refuse",
    )
    allow_insecure_remote: bool = Field(
        default=False,
        description="accept plaintext listeners (servers' gRPC and HTTP, the supervisor's HTTP) on "
        "non-loopback addresses; passed on to every server",
    )
    leases: bool = Field(
        default=False,
        description="run only while a Spark application holds a lease on the node: read the lease files "
        "in <runtime dir>/leases (written by the jobs that start the node, udfserve.spark_client."
        "node_servers), ask each lease's holder every --lease-poll-s whether it still holds it, and stop "
        "as on SIGTERM once none is held",
    )
    lease_poll_s: float = Field(
        default=2.0, gt=0, le=300.0, description="with --leases: how often each lease's holder is asked"
    )
    lease_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="with --leases: a lease whose holder has not answered for this long (its driver "
        "killed, its host unreachable) is dropped; at least twice --lease-poll-s",
    )
    starter_lock_fd: int | None = Field(
        default=None,
        ge=0,
        description="a descriptor of <runtime dir>/node-start.lock that the process starting this node "
        "holds locked; closed once the node holds its own lock, so that no second node starts meanwhile "
        "(set by the Spark jobs that start nodes; default: none)",
    )

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: str) -> str:
        try:
            return check_devices_syntax(value)
        except DeviceError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("server_port_base", mode="before")
    @classmethod
    def _port_off(cls, value: object) -> object:
        return _port_or_off(value)

    @field_validator("server_args")
    @classmethod
    def _shell_words(cls, value: str) -> str:
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"server_args {value!r} is not a valid shell word list: {exc}") from None
        check_server_args(words)
        return value

    @field_validator("model_repository")
    @classmethod
    def _repository_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model repository {value} is not a folder")
        return value.resolve()

    @model_validator(mode="after")
    def _socket_paths_fit(self) -> NodeConfig:
        longest = len(str(self.runtime_dir.absolute())) + 1 + LONGEST_SOCKET_NAME
        if longest > UNIX_SOCKET_PATH_MAX:
            raise ValueError(
                f"runtime_dir {self.runtime_dir} is too long for unix socket paths: "
                f"<runtime dir>/server-<device>.sock must fit in {UNIX_SOCKET_PATH_MAX} bytes, "
                f"it would take up to {longest}"
            )
        if not self.allow_insecure_remote:
            listeners = [
                ("--server-host", self.server_host, self.server_port_base is not None),
                ("--server-http-host", self.server_http_host, True),
                ("--supervisor-http-host", self.supervisor_http_host, True),
            ]
            remote = [f"{flag} {host}" for flag, host, used in listeners if used and not is_loopback(host)]
            # Servers given TLS through --server-args check their own listeners; the supervisor's
            # HTTP app (health and metrics) has no TLS, so beyond loopback it needs the flag.
            if "--tls-cert-file" in self.server_args:
                remote = [r for r in remote if r.startswith("--supervisor")]
            if remote:
                raise ValueError(
                    f"refusing plaintext listeners on non-loopback addresses ({', '.join(remote)}): "
                    "give the servers TLS through --server-args (--tls-cert-file, --tls-key-file) and keep "
                    "the supervisor on loopback, or accept them explicitly with --allow-insecure-remote"
                )
        if self.discovery_stale_after_s < 2 * self.discovery_heartbeat_s:
            raise ValueError(
                f"discovery_stale_after_s ({self.discovery_stale_after_s}) must be at least twice "
                f"discovery_heartbeat_s ({self.discovery_heartbeat_s}): a heartbeat written a little "
                "late must not make readers take a live node's file for absent"
            )
        if self.lease_timeout_s < 2 * self.lease_poll_s:
            raise ValueError(
                f"lease_timeout_s ({self.lease_timeout_s}) must be at least twice lease_poll_s "
                f"({self.lease_poll_s}): a holder's answer a little late must not drop its lease"
            )
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise ValueError(
                f"restart_backoff_max_s ({self.restart_backoff_max_s}) is below "
                f"restart_backoff_initial_s ({self.restart_backoff_initial_s})"
            )
        return self

    @property
    def node(self) -> str:
        return self.node_name or socket.gethostname()

    @property
    def discovery_path(self) -> Path:
        """The discovery file, resolved exactly as the Spark client resolves it."""
        environ = {RUNTIME_DIR_ENV: str(self.runtime_dir)}
        if self.discovery_file is not None:
            environ[DISCOVERY_FILE_ENV] = str(self.discovery_file)
        return default_discovery_path(environ)

    @property
    def runtime_dir_mode(self) -> int:
        """The mode the node creates its runtime folder with: private for the default per-user
        folder, readable by executors of other users for a folder named on purpose."""
        return PRIVATE_MODE if self.runtime_dir == default_runtime_dir() else SHARED_MODE

    @property
    def lock_path(self) -> Path:
        return self.runtime_dir / "node.lock"

    @property
    def targets_path(self) -> Path:
        return self.runtime_dir / "prometheus-targets.json"

    @property
    def fallback_reports_dir(self) -> Path:
        """Where the Spark clients report the rows their CPU fallback answered (``fallback_metrics``)."""
        return self.runtime_dir / FALLBACK_REPORTS_DIR_NAME

    @property
    def log_dir(self) -> Path:
        return self.runtime_dir / "logs"

    @property
    def server_extra_args(self) -> list[str]:
        return shlex.split(self.server_args)

    def server_flags(self, device: DeviceSlot) -> list[str]:
        """The flags the node gives the server on ``device`` beyond those of ``launch_server``
        (repository, device, socket, ports, ready file, lifeline); ``--server-args`` follow them."""
        flags = [word for name in SHARED_SETTINGS for word in shared_flag(name, getattr(self, name))]
        flags += ["--host", self.server_host, "--http-host", self.server_http_host]
        if self.allow_insecure_remote:
            flags.append("--allow-insecure-remote")
        if device.uuid:
            flags += ["--device-uuid", device.uuid]
        if self.models:
            flags += ["--models", ",".join(self.models)]
        return flags


def shared_flag(name: str, value: object) -> list[str]:
    """The server's flag for the node's value of a shared setting: none for an unset one (the
    server's default is the same None), ``--x`` / ``--no-x`` for a switch, else ``--x VALUE``."""
    if value is None:
        return []
    if isinstance(value, bool):
        return [flag_name(name) if value else "--no-" + flag_name(name).removeprefix("--")]
    return [flag_name(name), str(value)]
