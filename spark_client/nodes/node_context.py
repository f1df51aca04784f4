"""Node servers started by the Spark job itself, for clusters where nothing can be installed on the hosts.

    from udfserve.spark_client import node_servers, remote_predict

    with node_servers(spark, model_repository="/models", devices="auto") as nodes:
        df.withColumn("p", remote_predict("m", "x", config=nodes.client_config())).write...

On entry the driver serves the context's **lease** (``node_lease.py``) and runs a **start stage**:
one task per executor, each of which starts ``udfserve node --leases`` on its host, detached from
the Python worker, or finds the node already running there (a host lock makes every executor and
task of a host share one node), and waits until its servers serve (``node_ensure.py``). The
stage is a barrier stage: its tasks are launched together, at most one per executor in each
round of offers, so they spread over the executors instead of queueing on the first ones free,
and the stage fails at once, rather than running on part of the cluster, where the cluster has
fewer free slots than executors. Spark refuses barrier stages under dynamic allocation; there the
stage is a plain one, and the hosts it misses start their node at their first task.

Inside the context, UDFs built with ``nodes.client_config()``, or built in this session without a
config (the context writes its settings into the session's conf, ``spark.udfserve.nodeStart``),
make sure at each task's start that their host runs a node, without waiting for it: an executor
added later (dynamic allocation, a host added) starts its host's node at its first task, whose
rows run on the CPU fallback until that node serves. No row is lost or answered twice (the
client's exactly-once rule holds whichever path answers a batch).

On exit the lease is released: each node stops once no application holds a lease on it, so a
node that several applications share stays while any of them runs. A driver that dies stops
answering, and its nodes drop its lease after ``lease_timeout_s``: no node outlives the
applications that use it.

Under Spark Connect the client process serves the lease, so the executors must reach it
(``lease_host``/``lease_port``; a start task that cannot says so), and the number of start tasks
comes from ``executors`` or the session's ``spark.executor.instances`` (a Connect client cannot
list the executors).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ClientSetupError
from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.nodes.host_start import HostReport, HostStarter
from udfserve.spark_client.nodes.node_lease import LeaseHolder
from udfserve.spark_client.nodes.routing import SPARK_CONF_MODEL_REPOSITORY, SPARK_CONF_NODE_START

logger = logging.getLogger(__name__)

START_LOCK_WAIT_S = 120.0
"""How long a start task waits for its host's start lock (a node of another application that is
stopping holds it until it has exited: its servers' grace period and a few seconds)."""


class NodeServersError(ClientSetupError):
    """The node servers could not be started everywhere; the message names each host and why."""


@dataclass(frozen=True)
class HostNode:
    """The node of one host, as the start stage found it."""

    host: str
    runtime_dir: str
    node: str
    supervisor_pid: int | None
    server_pids: dict[str, int]
    started: bool
    """Whether a start task of this context started it (else it was running already)."""
    executors: tuple[str, ...] = ()


@dataclass
class NodeServers:
    """An open ``node_servers`` context: its lease, its settings, and the hosts' nodes."""

    spark: Any
    start: NodeStart
    holder: LeaseHolder
    executors: int | None
    start_timeout_s: float
    hosts: list[HostNode] = field(default_factory=list)
    _conf_set: list[str] = field(default_factory=list)
    _closed: bool = False

    def client_config(self, config: ClientConfig | None = None, **overrides: Any) -> ClientConfig:
        """``config`` (default: a fresh one) with ``overrides``, set to ensure its host's node at
        each task's start, with the context's repository for the CPU fallback unless it names one,
        and the context's runtime folder's discovery file when the context names a folder."""
        base = (config or ClientConfig()).model_dump(exclude_unset=True)
        update: dict[str, Any] = {**overrides, "node_start": self.start}
        if base.get("model_repository") is None and "model_repository" not in overrides:
            update["model_repository"] = self.start.model_repository
        if (
            self.start.runtime_dir
            and base.get("discovery_file") is None
            and "discovery_file" not in overrides
        ):
            update["discovery_file"] = str(Path(self.start.runtime_dir) / "discovery.json")
        return ClientConfig.model_validate({**base, **update})

    def ensure(self, executors: int | None = None) -> list[HostNode]:
        """Run the start stage again (after executors were added, say): every host it reaches runs
        a node and serves before it returns. The hosts' nodes, also in ``hosts``."""
        self.hosts = _run_start_stage(
            self.spark, self.start, executors or self.executors, self.start_timeout_s
        )
        return self.hosts

    def close(self) -> None:
        """Release the lease (the nodes of this context stop unless another application holds
        them) and take the context's settings out of the session's conf."""
        if self._closed:
            return
        self._closed = True
        for key in self._conf_set:
            with contextlib.suppress(Exception):  # a session already stopped
                self.spark.conf.unset(key)
        missing = self.holder.release(wait_s=2 * self.start.lease_poll_s + 5.0)
        if missing:
            logger.info(
                "udfserve: nodes %s did not ask for the lease again before it stopped being served; they "
                "drop it within %g s",
                sorted(f"{node} (pid {pid})" for node, pid in missing),
                self.start.lease_timeout_s,
            )


@contextlib.contextmanager
def node_servers(
    spark: Any,
    model_repository: str | Path,
    devices: str = "auto",
    *,
    models: Sequence[str] = (),
    runtime_dir: str | Path | None = None,
    node_args: Sequence[str] = (),
    executors: int | None = None,
    start_timeout_s: float = 300.0,
    lease_poll_s: float = 2.0,
    lease_timeout_s: float = 30.0,
    lease_host: str | None = None,
    lease_port: int = 0,
) -> Iterator[NodeServers]:
    """Start one ``udfserve node`` on every host of the session's executors, for the life of the context.

    ``model_repository`` is the path every host's servers load (the same on every host: a shared
    or replicated folder). ``devices``, ``models`` and ``node_args`` are ``udfserve node``'s
    ``--devices``, ``--models`` and further flags. ``runtime_dir`` is the node's folder on each
    host (default: the executors' ``UDFSERVE_RUNTIME_DIR``, else ``/tmp/udfserve-<uid>``).
    ``executors``: the number of start tasks (default: the executors registered now; under
    Spark Connect, ``spark.executor.instances``). ``start_timeout_s`` bounds the wait for each
    host's node to serve. ``lease_poll_s`` and ``lease_timeout_s`` are the nodes' ``--lease-*``
    settings; ``lease_host``/``lease_port`` where this process serves the lease (default: the
    driver's host, ``spark.driver.host``, and a free port).

    Raises ``NodeServersError`` naming every host whose node did not start or serve; the lease is
    released then, so the nodes this context started stop again.
    """
    start_spec, holder = _open_lease(
        spark, model_repository, devices, models, runtime_dir, node_args, lease_poll_s, lease_timeout_s,
        lease_host, lease_port,
    )  # fmt: skip
    nodes = NodeServers(spark, start_spec, holder, executors, start_timeout_s)
    try:
        nodes.ensure()
        _set_conf(nodes)
        yield nodes
    finally:
        nodes.close()


def _open_lease(
    spark: Any,
    model_repository: str | Path,
    devices: str,
    models: Sequence[str],
    runtime_dir: str | Path | None,
    node_args: Sequence[str],
    lease_poll_s: float,
    lease_timeout_s: float,
    lease_host: str | None,
    lease_port: int,
) -> tuple[NodeStart, LeaseHolder]:
    if lease_timeout_s < 2 * lease_poll_s:
        raise ValueError(
            f"lease_timeout_s ({lease_timeout_s}) must be at least twice lease_poll_s ({lease_poll_s})"
        )
    host, bind_host = _lease_address(spark, lease_host)
    holder = LeaseHolder(
        host,
        bind_host,
        lease_port,
        application=_conf(spark, "spark.app.id"),
        app_name=_conf(spark, "spark.app.name"),
    )
    try:
        start = NodeStart(
            model_repository=str(model_repository),
            devices=devices,
            models=tuple(models),
            runtime_dir=str(runtime_dir) if runtime_dir is not None else None,
            node_args=tuple(node_args),
            lease=holder.lease,
            lease_poll_s=lease_poll_s,
            lease_timeout_s=lease_timeout_s,
        )
    except ValueError:
        holder.release(wait_s=0)
        raise
    logger.info("udfserve: node lease %s served at %s", holder.lease.lease_id, holder.lease.holder)
    return start, holder


def _set_conf(nodes: NodeServers) -> None:
    """Write the context's settings into the session's conf, for UDFs built inside it without
    ``client_config()``; ``close`` takes them out again."""
    spark = nodes.spark
    spark.conf.set(SPARK_CONF_NODE_START, nodes.start.to_json())
    nodes._conf_set.append(SPARK_CONF_NODE_START)
    if not _conf(spark, SPARK_CONF_MODEL_REPOSITORY):
        spark.conf.set(SPARK_CONF_MODEL_REPOSITORY, nodes.start.model_repository)
        nodes._conf_set.append(SPARK_CONF_MODEL_REPOSITORY)


def _run_start_stage(spark: Any, start: NodeStart, executors: int | None, timeout_s: float) -> list[HostNode]:
    tasks = executors or _executor_count(spark)
    barrier = _conf(spark, "spark.dynamicAllocation.enabled").lower() != "true"
    starter = HostStarter(start, lock_wait_s=START_LOCK_WAIT_S, ready_timeout_s=timeout_s)
    frame = spark.range(tasks, numPartitions=tasks).mapInArrow(starter, "report string", barrier=barrier)
    reports = [HostReport.from_json(row.report) for row in frame.collect()]
    errors = [
        f"{r.host} ({r.executor or 'an executor'}, runtime folder {r.runtime_dir}): {r.error}"
        for r in reports
        if r.error
    ]
    if errors:
        raise NodeServersError("node servers did not start on every host:\n  " + "\n  ".join(errors))
    return _hosts(reports)


def _hosts(reports: list[HostReport]) -> list[HostNode]:
    """One entry per node (a host and runtime folder), whichever of its executors reported it."""
    by_node: dict[tuple[str, str], list[HostReport]] = {}
    for report in reports:
        by_node.setdefault((report.host, report.runtime_dir), []).append(report)
    return [
        HostNode(
            host=host,
            runtime_dir=runtime_dir,
            node=found[0].node,
            supervisor_pid=found[0].supervisor_pid,
            server_pids=found[0].server_pids,
            started=any(r.action == "started" for r in found),
            executors=tuple(sorted(r.executor for r in found if r.executor)),
        )
        for (host, runtime_dir), found in sorted(by_node.items())
    ]


def _executor_count(spark: Any) -> int:
    """The executors registered (at least 1: a local session's driver runs the tasks), after
    waiting for ``spark.executor.instances`` of them, as Spark waits before its first stage, up to
    ``spark.scheduler.maxRegisteredResourcesWaitingTime``; under Spark Connect
    ``spark.executor.instances`` or, with a local master, 1."""
    context = _spark_context(spark)
    if context is not None:
        scala = context._jsc.sc()
        wanted = _conf(spark, "spark.executor.instances")
        deadline = time.monotonic() + float(
            scala.conf().getTimeAsSeconds("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s")
        )
        while (
            wanted.isdigit() and scala.getExecutorIds().size() < int(wanted) and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        return max(1, int(scala.getExecutorIds().size()))
    if _conf(spark, "spark.master").startswith("local"):
        return 1
    instances = _conf(spark, "spark.executor.instances")
    if instances.isdigit() and int(instances) > 0:
        return int(instances)
    raise NodeServersError(
        "node_servers cannot tell how many executors to start nodes on: a Spark Connect client cannot list "
        "the cluster's executors and the session sets no spark.executor.instances; pass executors=N (at "
        "least the number of hosts: each host's executors share its node, and the hosts the start stage "
        "misses start theirs at their first task)"
    )


def _lease_address(spark: Any, lease_host: str | None) -> tuple[str, str]:
    """(the host the nodes dial, the address to bind). In a classic session the driver's own host,
    which every executor reaches; under Spark Connect this process's address on the way to the
    Spark driver (the client runs elsewhere than the driver)."""
    if lease_host:
        return lease_host, lease_host
    driver_host = _conf(spark, "spark.driver.host") or "127.0.0.1"
    if _spark_context(spark) is not None:
        return driver_host, _conf(spark, "spark.driver.bindAddress") or driver_host
    local = _local_address_towards(driver_host)
    return local, local


def _local_address_towards(host: str) -> str:
    """The address of this machine's interface that reaches ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _spark_context(spark: Any) -> Any:
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect sessions have no SparkContext
        return None


def _conf(spark: Any, key: str) -> str:
    try:
        return str(spark.conf.get(key, None) or "")
    except Exception:  # a key a Spark Connect server refuses to read
        return ""
