"""Typed configuration of the server process: flags and ``UDFSERVE_*`` variables.

Precedence: a command-line flag, then the ``UDFSERVE_<FIELD>`` environment variable, then the
default. Each model's ``config.yaml`` is the runtime's (``udfserve.runtime.model_config``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from udfserve.runtime.device import DEVICE_PATTERN
from udfserve.runtime.model_config import validate_model_name
from udfserve.services.model_server.core.cpu_parallel import ROW_ALIGNMENT
from udfserve.services.model_server.event_loop import EventLoopChoice
from udfserve.services.model_server.priority_classes import parse_priority_classes
from udfserve.services.model_server.shared_settings import SharedServerSettings
from udfserve.shared_memory import DEFAULT_DIRECTORY as DEFAULT_SHARED_MEMORY_DIRECTORY

MAX_TRACKED_APPS = 512
"""Most Spark applications a server keeps as metric labels: each adds about 6 KB and 0.23 ms of
rendering to every /metrics page (measured on 2 cores), so 512 render in about 0.1 s."""


class ServerConfig(SharedServerSettings):
    """One model server process. Fields map to ``--flag-name`` and ``UDFSERVE_FLAG_NAME``."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="forbid", frozen=True)

    model_repository: Path = Field(description="folder of <model>/config.yaml and <model>/<version>/")
    models: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="load only these models (default: all)"
    )
    version_lease_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86400.0,
        description="a version the policy no longer serves stays loaded for requests that name it "
        "(a Spark job pins the version it started with) until this long after the last of them, and "
        "at least this long after it was replaced; 0: unloaded at once, as it used to be",
    )
    max_leased_versions: int = Field(
        default=2,
        ge=0,
        le=16,
        description="older versions of one model kept for leases at once; a version replaced past it "
        "is unloaded at once, and requests naming it are refused NOT_FOUND saying why",
    )
    max_leased_version_bytes: int = Field(
        default=8 << 30,
        ge=0,
        description="bytes of model files (on disk) of the versions kept for leases, over every model; "
        "a version that would take it past is unloaded at once",
    )
    device: str = Field(
        default="cpu",
        description='"cpu", "gpu:N" or "sim:N" (a CPU process labelled as device N); pinned to it',
    )
    device_uuid: str | None = Field(default=None, description="NVML uuid of the device, for metrics labels")
    socket: Path | None = Field(default=None, description="unix socket path for gRPC (none if unset)")
    socket_mode: str = Field(
        default="0600", pattern=r"^0?[0-7]{3}$", description="permissions of the unix socket (octal)"
    )
    host: str = Field(default="127.0.0.1", description="TCP host for gRPC")
    port: int | None = Field(
        default=7500, ge=0, le=65535, description="TCP port for gRPC; 0 picks a free one, off disables TCP"
    )
    kserve_frontend: Literal["python", "native"] = Field(
        default="python",
        description="front end of the KServe v2 protocol: python (grpc.aio, on the main gRPC port and "
        "socket, beside the Arrow service) or native (grpc++, built by `python -m "
        "udfserve.services.model_server.frontends.kserve.native.build`, on --kserve-port of --host; "
        "much less CPU per request)",
    )
    kserve_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="TCP port of the native KServe front end (--kserve-frontend native); 0 picks a free one",
    )
    kserve_http_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="TCP port of --host serving the KServe v2 protocol over HTTP/REST (Triton's /v2 routes, "
        "JSON and binary tensors); 0 picks a free one; off (the default) serves none",
    )
    kserve_http_loop: Literal["own", "serving"] = Field(
        default="own",
        description="where the KServe HTTP port runs: own (a thread and event loop of its own, as the "
        "admin app: a flood of HTTP requests leaves the gRPC predictions 1.5 to 4 times the rate it does "
        "on the serving loop) or serving (on the event loop that serves gRPC: more HTTP requests a second "
        "under load, at the gRPC predictions' expense)",
    )
    http_host: str = Field(default="127.0.0.1", description="host of the HTTP admin app")
    http_port: int | None = Field(
        default=7501, ge=0, le=65535, description="HTTP admin port; 0 picks a free one, off disables HTTP"
    )
    ready_file: Path | None = Field(
        default=None,
        description="write the bound addresses here as JSON once listening, and again with the "
        "loaded models (or, when none serves, why: not_serving) once loading has finished",
    )
    max_message_bytes: int = Field(
        default=64 << 20, ge=1 << 16, le=(1 << 31) - 1, description="largest gRPC message, both ways"
    )
    max_stream_held_requests: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="requests one stream (Arrow Predict, KServe ModelStreamInfer) holds read and not yet "
        "answered onto the wire, queued, answered or refused alike; at it the server stops reading "
        "the stream until the client takes answers",
    )
    max_stream_held_bytes: int = Field(
        default=32 << 20,
        ge=1 << 16,
        description="bytes of the request messages one stream holds read and not yet answered onto the "
        "wire; at it the server stops reading the stream (a stream holding nothing still reads "
        "one message up to --max-message-bytes)",
    )
    max_unary_held_bytes: int = Field(
        default=256 << 20,
        ge=1 << 16,
        description="bytes of unary KServe ModelInfer calls the server holds, read or being read, and not "
        "yet answered; a call is read once there is room for a message of --max-message-bytes "
        "and waits unread until then (one call is always read while none is held); the native KServe "
        "port has a budget of this size of its own, for all its calls",
    )
    trim_after_call_bytes: int = Field(
        default=16 << 20,
        ge=0,
        description="after a unary KServe ModelInfer call (any call on the native KServe port) of at "
        "least this many bytes is answered, hand the memory the process freed back to the system "
        "(glibc's malloc_trim, at most once a second); 0 never trims",
    )
    max_concurrent_calls: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="gRPC calls (streams and unary calls, health checks included) the server handles "
        "at once; calls beyond are refused RESOURCE_EXHAUSTED before anything of them is read (some "
        "may first wait, unread, in gRPC's queue of calls not yet handed to the server); the native "
        "KServe port counts its own calls against a limit of this size",
    )
    shared_memory_dir: Path | None = Field(
        default=Path(DEFAULT_SHARED_MEMORY_DIRECTORY),
        description="tmpfs folder where clients on the unix socket may put payloads (udfserve-*.shm "
        "files of the server's user, or of --shared-memory-uids); 'off' disables shared memory",
    )
    shared_memory_uids: Annotated[tuple[int, ...], NoDecode] = Field(
        default=(),
        description="other users (uids, comma-separated) whose shared-memory files this server reads, "
        "such as 185 for executors of the apache/spark images; their files must give this server's "
        "group read and write (the client's shared_memory_group_access)",
    )
    shared_memory_max_request_bytes: int = Field(
        default=256 << 20,
        ge=1 << 16,
        le=1 << 40,
        description="largest request a client may name in shared memory: the server copies each "
        "request out of the client's file into its own memory, and refuses a larger one with "
        "INVALID_ARGUMENT before copying",
    )
    exit_timeout_s: float = Field(
        default=5.0,
        ge=0.0,
        le=600.0,
        description="after SIGTERM the process exits within --grace-period-s plus this, whatever its "
        "threads are doing (a model call that cannot be stopped included), as Triton's "
        "--exit-timeout-secs",
    )
    model_call_timeout_s: float = Field(
        default=120.0,
        ge=0.0,
        le=86400.0,
        description="bound on one backend call: a call past it is stopped where the backend can stop one "
        "(ONNX Runtime) and its batch fails DEADLINE_EXCEEDED; one that cannot be stopped (TensorFlow, "
        "PyTorch) fails what the model holds UNAVAILABLE and the server exits for a fresh process; "
        "0: no bound",
    )
    inference_threads: int = Field(default=1, ge=1, le=64, description="concurrent backend calls per model")
    cpu_parallel_min_rows: int = Field(
        default=0,
        ge=0,
        description="on a CPU device (cpu, sim:N), a backend call of at least twice this many rows runs as "
        "one call per core on contiguous parts, concurrently (256 is a good start): lower latency for "
        "large requests on idle cores, more CPU per row; 0 (default) never cuts calls",
    )
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
    application_scheduling: Literal["fair", "fifo"] = Field(
        default="fair",
        description="how a model's queue serves Spark applications: 'fair' gives each application its "
        "priority class's weight in rows while it has requests waiting (requests naming no application "
        "form one more application), and bounds each one's part of the queue; 'fifo': one queue in "
        "arrival order",
    )
    priority_classes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("interactive=8", "default=2", "batch=1"),
        description="the priority classes a client may name (spark.udfserve.priorityClass) and their "
        "weights, 'name=weight' comma-separated; an application that names no class, or one not listed, "
        "gets --default-priority-class",
    )
    default_priority_class: str = Field(
        default="default", description="the class of applications that name none (one of --priority-classes)"
    )
    room_wait_s: float = Field(
        default=10.0,
        ge=0.0,
        le=600.0,
        description="how long a request of a Predict stream that finds its application's share of a "
        "model's queue full waits for room (its stream read no further meanwhile) before it is refused "
        "RESOURCE_EXHAUSTED; 0: refused at once, and the client backs off and sends it again",
    )
    max_tracked_apps: int = Field(
        default=64,
        ge=1,
        description="Spark applications kept in metrics labels (least recent out); at most "
        f"{MAX_TRACKED_APPS}, whose /metrics page renders in about 0.1 s",
    )
    http_docs: bool = Field(
        default=False,
        description="serve the admin app's OpenAPI document and pages (/openapi.json, /docs, /redoc); "
        "the document needs the token when one is set",
    )
    admin_requests_per_s: float = Field(
        default=10.0,
        gt=0,
        description="HTTP admin requests a second per client address (bursts of twice that); a client "
        "over it is answered 429 with Retry-After",
    )
    admin_total_requests_per_s: float = Field(
        default=50.0,
        gt=0,
        description="HTTP admin requests a second from all clients together; beyond, requests wait "
        "their turn, so a flood cannot take the CPU the predictions need",
    )
    metrics_min_interval_s: float = Field(
        default=0.0,
        ge=0,
        description="least time between two renders of /metrics; scrapes in between wait for the next "
        "render and share it (renders are also paced to at most 2 percent of a core)",
    )
    slow_request_s: float = Field(
        default=1.0, gt=0, description="log requests slower than this with their Spark stage and partition"
    )
    event_loop: EventLoopChoice = Field(
        default="auto",
        description="event loop of the server: uvloop (less CPU per request), asyncio (the standard "
        "loop), or auto: uvloop when installed",
    )
    lifeline_fd: int | None = Field(
        default=None,
        ge=0,
        description="inherited read end of a pipe whose write end the starting process holds: at its "
        "end of file (that process died, even by SIGKILL) the server drains and exits as on SIGTERM; "
        "`udfserve node` passes it to every server",
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

    @field_validator("max_tracked_apps")
    @classmethod
    def _max_tracked_apps(cls, value: int) -> int:
        if value > MAX_TRACKED_APPS:
            raise ValueError(
                f"expected at most {MAX_TRACKED_APPS} tracked Spark applications, received {value}: each "
                "one adds about 6 KB and 0.23 ms of rendering to every /metrics page, which shares the "
                "CPU with the predictions"
            )
        return value

    @field_validator("cpu_parallel_min_rows")
    @classmethod
    def _cpu_parallel_min_rows(cls, value: int) -> int:
        if 0 < value < ROW_ALIGNMENT:
            raise ValueError(
                f"cpu_parallel_min_rows must be 0 (off) or at least {ROW_ALIGNMENT} rows, received {value}"
            )
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE_PATTERN.match(value):
            raise ValueError(f'invalid device {value!r}; expected "cpu", "gpu:N" or "sim:N" (e.g. gpu:0)')
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("priority_classes", mode="before")
    @classmethod
    def _split_classes(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("priority_classes")
    @classmethod
    def _check_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        parse_priority_classes(value)
        return value

    @property
    def class_weights(self) -> dict[str, int]:
        """``priority_classes`` as a mapping of class name to weight."""
        return parse_priority_classes(self.priority_classes)

    @field_validator("shared_memory_uids", mode="before")
    @classmethod
    def _split_uids(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        uids = []
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            if not item.isdigit():
                raise ValueError(
                    f"expected numeric uids separated by commas, such as '185,1000'; received {value!r}"
                )
            uids.append(int(item))
        return tuple(uids)

    @field_validator(
        "port", "http_port", "kserve_port", "kserve_http_port", "shared_memory_dir", mode="before"
    )
    @classmethod
    def _port_off(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in {"off", "none", ""}:
            return None
        return value

    @field_validator("shared_memory_dir")
    @classmethod
    def _absolute_folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"expected an absolute folder path or 'off', received {str(value)!r}")
        return value

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(validate_model_name(v) for v in value)

    @model_validator(mode="after")
    def _default_class_is_listed(self) -> ServerConfig:
        if self.default_priority_class not in self.class_weights:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of the priority classes "
                f"{sorted(self.class_weights)}; expected one of them"
            )
        return self

    @model_validator(mode="after")
    def _some_listener(self) -> ServerConfig:
        if self.socket is None and self.port is None:
            raise ValueError("nothing to listen on: give a unix socket, a TCP port, or both")
        return self

    @model_validator(mode="after")
    def _kserve_listener(self) -> ServerConfig:
        if self.kserve_frontend == "native" and self.kserve_port is None:
            raise ValueError(
                "--kserve-frontend native listens on its own port: give --kserve-port (0 picks one)"
            )
        if self.kserve_frontend == "python" and self.kserve_port is not None:
            raise ValueError(
                "--kserve-port is the native front end's port; expected --kserve-frontend native with it "
                "(the python front end serves KServe on --port and --socket)"
            )
        return self

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


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: localhost, 127.0.0.0/8, ::1."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything
