"""What a task needs to make sure its host runs a node: the node's settings and the application's lease.

``node_servers`` (the driver) builds one ``NodeStart`` per context and ships it inside the UDFs'
config (``ClientConfig.node_start``), and in the session's Spark conf as JSON
(``spark.udfserve.nodeStart``) so that UDFs built inside the context take it up too. Executors
read nothing else to start a node: the host's own environment only says where its runtime folder
is (``UDFSERVE_RUNTIME_DIR``, as for a node installed there).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from udfserve.node_leases import Lease


class NodeStart(BaseModel):
    """A node as one application context asks for it on every host, and that context's lease."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_repository: str = Field(
        description="the repository every server loads (the same path on every host)"
    )
    devices: str = Field(
        default="auto", description="`udfserve node --devices`: auto, cpu, 0,1 or sim:0,sim:1"
    )
    models: tuple[str, ...] = Field(default=(), description="load only these models (default: all)")
    runtime_dir: str | None = Field(
        default=None,
        description="the node's runtime folder on every host (default: the executor's UDFSERVE_RUNTIME_DIR, "
        "else /tmp/udfserve-<uid>)",
    )
    node_args: tuple[str, ...] = Field(
        default=(), description="more `udfserve node` flags, after the ones the context sets"
    )
    lease: Lease
    lease_poll_s: float = Field(default=2.0, gt=0)
    lease_timeout_s: float = Field(default=30.0, gt=0)

    @field_validator("model_repository")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not Path(value).is_absolute():
            raise ValueError(f"model_repository {value!r} must be an absolute path, the same on every host")
        return value

    def node_arguments(self, runtime_dir: Path, starter_lock_fd: int) -> list[str]:
        """The flags of ``udfserve node`` for this host's node."""
        arguments = [
            "--model-repository",
            self.model_repository,
            "--devices",
            self.devices,
            "--runtime-dir",
            str(runtime_dir),
            "--supervisor-http-port",
            "0",
            "--leases",
            "--lease-poll-s",
            str(self.lease_poll_s),
            "--lease-timeout-s",
            str(self.lease_timeout_s),
            "--starter-lock-fd",
            str(starter_lock_fd),
        ]
        if self.models:
            arguments += ["--models", ",".join(self.models)]
        if self.runtime_dir is not None:
            arguments += ["--discovery-file", str(runtime_dir / "discovery.json")]
        return arguments + list(self.node_args)
