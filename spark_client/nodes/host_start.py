"""The start stage of ``node_servers``: one task per executor finds or starts its host's node and
waits until it serves.

``node_servers`` (``node_context``, in the driver) runs ``HostStarter`` as a barrier stage of
``mapInArrow`` before the job's first UDF. Each task waits for the start lock, finds or starts the
node (``node_ensure.ensure_node``, what any task of a UDF built inside the context also runs, without
waiting), then waits for the node's discovery file to list every server ready, serving the
repository the context asks for (``wait_until_serving``). Its answer is one row: a ``HostReport``
as JSON, an error included, so that the driver names every host's problem at once and Spark does
not retry the stage.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from udfserve.discovery import DiscoveryError, NodeDiscovery, read_live_discovery
from udfserve.node_files import trusted_uids
from udfserve.node_leases import START_LOCK_FILE
from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.nodes.node_ensure import (
    NODE_LOG,
    HostCheck,
    NodeStartError,
    discovery_file_of,
    ensure_node,
    log_tail,
    process_alive,
    runtime_dir_of,
)


@dataclass
class HostReport:
    """One start task's answer: where it ran and the node it found or started."""

    host: str
    executor: str
    runtime_dir: str
    discovery_file: str
    action: str = ""
    node: str = ""
    supervisor_pid: int | None = None
    server_pids: dict[str, int] = field(default_factory=dict)
    model_repository: str = ""
    error: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HostReport:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class HostStarter:
    """The function of the start stage's tasks (``mapInArrow``): each finds or starts its host's
    node and waits until every server of it is ready; one row, a ``HostReport`` as JSON. A failure
    is reported in the row rather than raised, so that the driver names every host's problem at
    once and Spark does not retry the stage."""

    start: NodeStart
    lock_wait_s: float
    ready_timeout_s: float

    def __call__(self, batches: Iterator[object]) -> Iterator[object]:
        import pyarrow as pa

        for _ in batches:
            pass
        report = self.run(os.environ, _executor_address())
        yield pa.RecordBatch.from_pydict({"report": [report.to_json()]})

    def run(self, environ: Mapping[str, str], executor: str) -> HostReport:
        host = socket.gethostname()
        report = HostReport(
            host,
            executor,
            str(runtime_dir_of(self.start, environ)),
            str(discovery_file_of(self.start, environ)),
        )
        try:
            check = ensure_node(self.start, environ, lock_wait_s=self.lock_wait_s)
            report.action = check.action
            if check.action == "busy":
                raise NodeStartError(
                    f"the start lock {check.runtime_dir / START_LOCK_FILE} stayed taken for "
                    f"{self.lock_wait_s:g} s (a node stopping, or a task starting one)"
                )
            if check.action == "unreachable":
                raise NodeStartError(
                    f"this executor cannot reach the lease's holder at {self.start.lease.holder}, the "
                    f"process that entered node_servers ({check.detail}); every executor must reach it "
                    "(under Spark Connect, that process is the client): set node_servers(lease_host=..., "
                    "lease_port=...) to an address they reach, or run `udfserve node` on every host "
                    "(a DaemonSet or an init script)"
                )
            if check.action == "released":
                raise NodeStartError(f"the lease was released before the node started ({check.detail})")
            discovery = wait_until_serving(self.start, check, self.ready_timeout_s)
        except NodeStartError as exc:
            report.error = str(exc)
            return report
        report.node = discovery.node
        report.supervisor_pid = discovery.supervisor_pid
        report.server_pids = {s.device: s.pid for s in discovery.servers if s.pid is not None}
        report.model_repository = discovery.model_repository or ""
        return report


def wait_until_serving(start: NodeStart, check: HostCheck, timeout_s: float) -> NodeDiscovery:
    """The node's discovery file once every server of it is ready, its repository the one
    ``start`` asks for. Raises ``NodeStartError`` when the node exits, a server fails its start,
    the node serves another repository (a node of another application, or installed there), or
    ``timeout_s`` passes."""
    host = socket.gethostname()
    deadline = time.monotonic() + timeout_s
    seen = "no discovery file yet"
    while time.monotonic() < deadline:
        try:
            discovery = read_live_discovery(check.discovery_file, trusted=trusted_uids())
        except DiscoveryError as exc:
            seen = str(exc)
        else:
            wanted = Path(start.model_repository).resolve()
            if discovery.model_repository and Path(discovery.model_repository) != wanted:
                raise NodeStartError(
                    f"{host} already runs a node (pid {discovery.supervisor_pid}, runtime folder "
                    f"{check.runtime_dir}) serving repository {discovery.model_repository}, not {wanted}: a "
                    "host runs one node, which every application on it shares; use its repository, or "
                    "another runtime folder (node_servers(runtime_dir=...))"
                )
            failed = {s.device: s.problem for s in discovery.servers if s.problem}
            if failed:
                raise NodeStartError(
                    f"the node on {host} (pid {discovery.supervisor_pid}) could not start its servers: "
                    f"{failed}; its log: {check.runtime_dir / NODE_LOG}"
                )
            states = {s.device: s.state for s in discovery.servers}
            if states and all(state == "ready" for state in states.values()):
                return discovery
            seen = f"servers {states}"
        pid = check.pid
        if pid is not None and not process_alive(pid):
            raise NodeStartError(
                f"the node on {host} (pid {pid}) exited before it served; the end of its log "
                f"{check.runtime_dir / NODE_LOG}:\n{log_tail(check.runtime_dir)}"
            )
        time.sleep(0.2)
    raise NodeStartError(
        f"the node on {host} (pid {check.pid}) did not serve within {timeout_s:g} s ({seen}); its log: "
        f"{check.runtime_dir / NODE_LOG}"
    )


def _executor_address() -> str:
    """The executor's ``host:port`` from a barrier task's context; "" in a plain task."""
    from pyspark import BarrierTaskContext, TaskContext

    context = TaskContext.get()
    if isinstance(context, BarrierTaskContext):
        return str(context.getTaskInfos()[context.partitionId()].address)
    return ""
