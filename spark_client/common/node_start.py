"""What a task needs to make sure its host runs a node: the node's settings and the application's lease.

``node_servers`` (the driver) builds one ``NodeStart`` per context and ships it inside the UDFs'
config (``ClientConfig.node_start``, then ``TaskConfig.node_start``), and in the session's Spark
conf as JSON (``spark.udfserve.nodeStart``) so that UDFs built inside the context take it up too.
Executors read nothing else to start a node: the host's own environment only says where its
runtime folder is (``UDFSERVE_RUNTIME_DIR``, as for a node installed there). A plain record
(``udfserve.records``): the tasks that read it import no pydantic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from udfserve.node_leases import Lease
from udfserve.records import RecordError, check_fields, record_from_dict, record_from_json, record_to_dict


@dataclass(frozen=True)
class NodeStart:
    """A node as one application context asks for it on every host, and that context's lease."""

    model_repository: str
    """the repository every server loads (the same path on every host)"""
    lease: Lease
    devices: str = "auto"
    """`udfserve node --devices`: auto, cpu, 0,1 or sim:0,sim:1"""
    models: tuple[str, ...] = ()
    """load only these models (default: all)"""
    runtime_dir: str | None = None
    """the node's runtime folder on every host (default: the executor's UDFSERVE_RUNTIME_DIR, else
    /tmp/udfserve-<uid>)"""
    node_args: tuple[str, ...] = ()
    """more `udfserve node` flags, after the ones the context sets"""
    lease_poll_s: float = 2.0
    lease_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_fields(self)
        if not Path(self.model_repository).is_absolute():
            raise RecordError(
                f"NodeStart.model_repository {self.model_repository!r} must be an absolute path, the same "
                "on every host"
            )
        for name in ("lease_poll_s", "lease_timeout_s"):
            if getattr(self, name) <= 0:
                raise RecordError(
                    f"NodeStart.{name}: expected seconds above 0, received {getattr(self, name)}"
                )

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeStart:
        """The node start ``node_servers`` wrote (the Spark conf's JSON); unknown fields are refused."""
        return record_from_json(cls, text, extra="forbid")

    @classmethod
    def from_dict(cls, data: object) -> NodeStart:
        return record_from_dict(cls, data, extra="forbid")

    def to_json(self) -> str:
        return json.dumps(record_to_dict(self))

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
