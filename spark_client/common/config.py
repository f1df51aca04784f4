"""The client's settings: one immutable object, built and validated in the driver.

The UDF's closure carries ``ClientConfig.task_config()`` (``task_config.TaskConfig``), the same
values in a plain dataclass, so that no Spark task imports pydantic.

Nothing here reads the environment: Spark reuses Python workers across tasks, so whatever a
task needs from the executor's environment (``UDFSERVE_ADDRESS``, the discovery file) is read
at task time by ``routing.py`` from the mapping it is given, and never written.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, SecretStr, field_validator, model_validator

from udfserve.shared_memory import DEFAULT_DIRECTORY as DEFAULT_SHARED_MEMORY_DIRECTORY
from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.common.task_config import TaskConfig, check_target
from udfserve.tracing import parse_traceparent

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
"""The server's default limit (``ServerConfig.max_message_bytes``); both sides must agree."""

DEFAULT_BYTES_PER_REQUEST = 2 << 20
"""Two MiB of input per request. The model, not the transport, sets the rate (shared memory moves
a request far faster than a model computes it), and each request in flight costs the executor's
Python worker its converted rows and its shared-memory file: smaller requests of wide rows lower
the workers' peak memory at the same rows/s (measured: docs/benchmarks.md, section 1, "Reading
the numbers")."""

__all__ = ["ClientConfig", "TaskConfig", "check_target", "with_conf_values"]


class ClientConfig(BaseModel):
    """How a UDF finds a model server and talks to it, and what it does when none answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(
        default=None,
        description="gRPC target of the server ('unix:///path' or 'host:port'); beats every other way "
        "of finding a server",
    )
    protocol: Literal["arrow", "kserve"] = Field(
        default="arrow",
        description="'arrow': udfserve's Arrow stream; 'kserve': the KServe v2 gRPC protocol, spoken by "
        "udfserve (same port) and by NVIDIA Triton (needs the 'kserve' extra: tritonclient)",
    )
    discovery_file: str | None = Field(
        default=None,
        description="the node's discovery file; default: UDFSERVE_DISCOVERY_FILE, then "
        "<UDFSERVE_RUNTIME_DIR or /tmp/udfserve-<uid>>/discovery.json on the executor",
    )
    priority_class: str | None = Field(
        default=None,
        max_length=32,
        description="the class the servers schedule this application in, such as 'interactive' or "
        "'batch' (the server maps classes to weights; one it does not list, or none, gets its default "
        "class)",
    )
    trusted_node_uids: tuple[int, ...] = Field(
        default=(),
        description="users (uids) besides the executor's own and root whose discovery file and runtime "
        "folder the client believes: the uid of a node run by a service user. A file or socket of "
        "any other user, or in a folder others may write, is refused and the rows run on the CPU "
        "fallback, naming why",
    )
    fallback_repository_from_node: bool = Field(
        default=False,
        description="let the CPU fallback load the model from the repository the node's discovery "
        "file names when model_repository is not set; off by default, since the fallback then runs "
        "model files that the node's user chose inside the job",
    )
    model_version: int = Field(
        default=0,
        ge=0,
        description="0 = the version a request naming none gets (the highest its policy serves); a pinned "
        "version the policy does not serve is NOT_FOUND, on the server and on the CPU fallback alike",
    )
    version_consistency: Literal["job", "request"] = Field(
        default="job",
        description="'job': the version serving when the UDF is built computes every row of the job, also "
        "when a new one is published while it runs (the servers keep it for the job: their "
        "--version-lease-s); 'request': each request gets the version serving when it arrives. Ignored "
        "when model_version names a version",
    )
    when_pinned_version_gone: Literal["fail", "follow"] = Field(
        default="fail",
        description="when a server no longer keeps the job's version (past its bounds on old versions): "
        "'fail' the task, saying why, or 'follow' on with the version serving, which the counters then "
        "show (rows_by_version, pinned_version_switches)",
    )
    rows_per_request: int = Field(
        default=4096,
        gt=0,
        description="most rows of one request; fewer where the server's max_batch_size or "
        "bytes_per_request is reached first",
    )
    bytes_per_request: int = Field(
        default=DEFAULT_BYTES_PER_REQUEST,
        ge=1 << 10,
        description="input bytes one request aims at: rows of a fixed size are sent fewer than "
        "rows_per_request at a time when that many would pass it",
    )
    max_in_flight: int = Field(
        default=4, ge=1, le=64, description="batches of one partition held at once (sent, unanswered)"
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="longest wait for the answer to the oldest batch in flight"
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="longest wait to connect to a server")
    fallback: Literal["cpu", "error"] = Field(
        default="cpu", description="when no server answers: predict in-process on the CPU, or fail the task"
    )
    model_repository: str | None = Field(
        default=None,
        description="where the CPU fallback finds the model; without it the fallback cannot run (or, "
        "with fallback_repository_from_node, it takes the repository the node's discovery file names)",
    )
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1 << 16)
    initial_backoff_s: float = Field(default=0.01, gt=0, description="first wait after RESOURCE_EXHAUSTED")
    max_backoff_s: float = Field(default=1.0, gt=0, description="longest wait between two resends")
    max_retry_time_s: float = Field(
        default=60.0, gt=0, description="give up resending one batch after this long; then fall back"
    )
    prefer_unix_socket: bool = Field(default=True, description="dial the unix socket before the TCP port")
    shared_memory: bool = Field(
        default=True,
        description="on a unix socket (a server on this node), put the Arrow payloads in shared memory "
        "instead of in the gRPC messages; batches go inline when the server cannot use it",
    )
    shared_memory_dir: str = Field(
        default=DEFAULT_SHARED_MEMORY_DIRECTORY,
        description="the tmpfs folder for those payloads: the server's --shared-memory-dir, seen at the "
        "same path by the executors",
    )
    shared_memory_group_access: bool = Field(
        default=False,
        description="create payload files that their group may read and write (0660, not 0600): for "
        "executors that run as another user than the server, in a folder of the server's group; the "
        "server must list the executors' uid in --shared-memory-uids",
    )
    circuit_reset_s: float = Field(
        default=10.0,
        ge=0,
        description="after a server failed, how long this Python worker leaves it alone before the next "
        "batch probes it again (0: every batch probes)",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="bearer token sent as 'authorization: Bearer <token>' on every call; never logged",
    )
    auth_token_file: str | None = Field(
        default=None,
        description="file holding the token, read where the call is made (driver and executors): keeps "
        "the token out of the serialised UDF",
    )
    tls_root_certificates_file: str | None = Field(
        default=None, description="PEM CA certificates that sign the servers' certificates (default: system)"
    )
    tls_server_name: str | None = Field(
        default=None,
        description="the name the servers' certificates are checked against instead of the host of "
        "the target (a certificate issued to a service's DNS name, dialled by IP address)",
    )
    tls_client_certificate_file: str | None = Field(
        default=None, description="PEM client certificate for mutual TLS"
    )
    tls_client_key_file: str | None = Field(
        default=None, description="PEM private key of tls_client_certificate_file"
    )
    trace_sample_ratio: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of tasks whose requests the servers trace (OpenTelemetry, W3C traceparent); "
        "0: tracing off, no header sent",
    )
    traceparent: str | None = Field(
        default=None,
        description="the job's one trace: a W3C traceparent (job_traceparent() makes one in the driver) "
        "under which every task's requests are traced when its sampled flag is set; beats "
        "trace_sample_ratio",
    )
    node_start: InstanceOf[NodeStart] | None = Field(
        default=None,
        description="set by node_servers(...): each task first makes sure its host runs a node, starting "
        "one, detached, where none runs (without waiting for it: the rows go to the CPU fallback until "
        "it is ready); a JSON string is read too (the Spark conf spark.udfserve.nodeStart)",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else check_target(value, "address")

    @field_validator(
        "discovery_file",
        "model_repository",
        "shared_memory_dir",
        "auth_token_file",
        "tls_root_certificates_file",
        "tls_client_certificate_file",
        "tls_client_key_file",
    )
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("expected a path or None, received an empty string")
        return value

    @field_validator("trusted_node_uids", mode="before")
    @classmethod
    def _uids(cls, value: object) -> object:
        """A Spark conf value is a string: ``"10001"`` or ``"10001,10002"``."""
        if isinstance(value, str):
            words = [word.strip() for word in value.split(",") if word.strip()]
            if not all(word.isdigit() for word in words):
                raise ValueError(
                    f"expected uids as numbers separated by commas, such as '10001', received {value!r}"
                )
            return tuple(int(word) for word in words)
        return value

    @field_validator("node_start", mode="before")
    @classmethod
    def _node_start(cls, value: object) -> object:
        """A Spark conf value is the JSON ``node_servers`` wrote there; a mapping is what
        ``model_dump`` gave (a config rebuilt with more values)."""
        if isinstance(value, str):
            return NodeStart.from_json(value)
        return NodeStart.from_dict(value) if isinstance(value, dict) else value

    @field_validator("traceparent")
    @classmethod
    def _traceparent(cls, value: str | None) -> str | None:
        if value is not None and parse_traceparent(value) is None:
            raise ValueError(
                f"traceparent {value!r} is not a W3C trace context; expected "
                "'00-<32 hex trace id>-<16 hex span id>-<2 hex flags>', ids not all zero"
            )
        return None if value is None else value.strip()

    @field_validator("tls_server_name")
    @classmethod
    def _server_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"expected a host name such as 'udfserve.internal' or None, received {value!r}")
        return value

    @model_validator(mode="after")
    def _backoff(self) -> ClientConfig:
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be at least initial_backoff_s "
                f"({self.initial_backoff_s})"
            )
        if (self.tls_client_certificate_file is None) != (self.tls_client_key_file is None):
            raise ValueError(
                "mutual TLS needs both tls_client_certificate_file and tls_client_key_file; received "
                f"certificate={self.tls_client_certificate_file!r}, key={self.tls_client_key_file!r}"
            )
        if self.auth_token is not None and self.auth_token_file is not None:
            raise ValueError("give auth_token or auth_token_file, not both")
        if self.auth_token is not None and not self.auth_token.get_secret_value().strip():
            raise ValueError("auth_token is empty; expected the server's token or None")
        return self

    @property
    def tls_enabled(self) -> bool:
        """TCP channels use TLS when any TLS setting is given; unix sockets stay plaintext (local only)."""
        return self.task_config().tls_enabled

    def task_config(self) -> TaskConfig:
        """These values as the UDF's closure carries them to the tasks: a plain dataclass whose
        unpickling imports no pydantic, the token as its text (left out of its ``repr``)."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        values["auth_token"] = None if self.auth_token is None else self.auth_token.get_secret_value()
        return TaskConfig(**values)


def with_conf_values(config: ClientConfig, update: dict[str, object], used: list[str]) -> ClientConfig:
    """``config`` with the values the driver read from the Spark conf keys ``used`` (the routing
    keys and the tracing keys alike); a ValueError names the keys when the result is not valid."""
    if not update:
        return config
    try:
        return ClientConfig.model_validate({**config.model_dump(exclude_unset=True), **update})
    except ValueError as exc:
        raise ValueError(
            f"the Spark conf ({', '.join(used)}) does not make a valid ClientConfig: {exc}"
        ) from None
