"""The node's discovery file: which model servers run on this node, and where.

The node supervisor (``udfserve node``) writes it; the Spark client reads it to find the
server local to its executor. It is JSON, replaced atomically (write to a temporary file in
the same folder, then ``os.replace``), so a reader never sees half a file.

The supervisor rewrites it at every change and at least every ``heartbeat_s`` seconds, each
time with the wall-clock time in ``updated_at``, and says in ``stale_after_s`` how old a file
may get before readers take it for absent (``read_live_discovery``): a supervisor killed with
its servers (SIGKILL, a node's power) cannot remove the file, and its ready servers would
otherwise be dialled at dead sockets forever. Wall-clock time, not a pid, because readers
may run in other PID namespaces (containers) than the supervisor; one node shares one clock.

Where it lives, in order: an explicit path; the ``UDFSERVE_DISCOVERY_FILE`` environment
variable; ``<runtime dir>/discovery.json`` where the runtime dir is ``UDFSERVE_RUNTIME_DIR``
or ``/tmp/udfserve-<uid>`` (``default_runtime_dir``). Callers pass the environment in (a mapping)
so that nothing here reads ``os.environ`` behind their back: Spark reuses Python workers across
tasks.

Every reader checks who could have written the file before it believes it (``node_files``): it
names the servers a job's rows go to.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from udfserve.node_files import UntrustedNodeFile, read_node_file, trusted_uids
from udfserve.records import RecordError, check_fields, record_from_json, record_to_dict

RUNTIME_DIR_PARENT = Path("/tmp")
DISCOVERY_FILE_NAME = "discovery.json"
DISCOVERY_FILE_ENV = "UDFSERVE_DISCOVERY_FILE"
RUNTIME_DIR_ENV = "UDFSERVE_RUNTIME_DIR"
SCHEMA_VERSION = 1

ServerState = Literal["starting", "ready", "restarting", "stopping"]


class DiscoveryError(ValueError):
    """The discovery file is missing, unreadable or not in the expected format."""


@dataclass(frozen=True)
class ServerEntry:
    """One model server process of the node."""

    device: str
    """"cpu", "gpu:N" or "sim:N" (a CPU process announced as device N)"""
    device_index: int | None = None
    """GPU index as Spark and NVML see it"""
    device_uuid: str | None = None
    unix_socket: str | None = None
    """path of the gRPC unix socket"""
    tcp_address: str | None = None
    """host:port of the gRPC TCP listener"""
    http_address: str | None = None
    """host:port of the HTTP admin app"""
    kserve_address: str | None = None
    """host:port of the server's --kserve-port: its native KServe front end, or the python one where
    --kserve-frontend auto found no native module (kserve_frontend says which)"""
    kserve_frontend: str | None = None
    """the KServe front end that serves: "native" or "python" (on kserve_address and kserve_socket
    where they are given, else on the main listeners); null for a server not ready, or written by an
    older node"""
    kserve_socket: str | None = None
    """path of the server's --kserve-socket, in the runtime folder: its native KServe front end's unix
    socket (the python one's where --kserve-frontend auto found no native module), for KServe clients
    at unix://<path>; null when the server has none, is not ready, or in a file written by an older
    node"""
    kserve_http_address: str | None = None
    """host:port of the KServe v2 HTTP/REST listener (servers run with --kserve-http-port)"""
    pid: int | None = None
    models: list[str] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)
    """each model's versions the server serves, kept current while it runs (model control poll or
    explicit changes them); empty in the file of a supervisor that did not list them"""
    state: ServerState = "ready"
    problem: str | None = None
    """why a server that is not ready failed its last start (it serves no model, it exited)"""

    def __post_init__(self) -> None:
        check_fields(self)

    def grpc_targets(self) -> list[str]:
        """gRPC target strings for this server, the unix socket first (it is faster)."""
        targets = []
        if self.unix_socket:
            targets.append(f"unix://{self.unix_socket}")
        if self.tcp_address:
            targets.append(self.tcp_address)
        return targets


@dataclass(frozen=True)
class NodeDiscovery:
    """The whole file: one plain record that the node writes and the Spark tasks read (a task
    imports no pydantic, ``udfserve.records``)."""

    schema_version: int = SCHEMA_VERSION
    node: str = ""
    supervisor_pid: int | None = None
    model_repository: str | None = None
    """the repository the servers load; the CPU fallback reads it too"""
    metrics_targets_file: str | None = None
    fallback_reports_dir: str | None = None
    """the folder where Spark clients report the rows their CPU fallback answered on this node,
    which the supervisor exports (udfserve.fallback_reports); None: a node that does not count them"""
    updated_at: float = field(default_factory=time.time)
    """when the supervisor last wrote the file (seconds since the epoch)"""
    heartbeat_s: float | None = None
    """the supervisor rewrites the file at least this often (seconds)"""
    stale_after_s: float | None = None
    """a file whose updated_at is older than this (seconds) is taken for absent: its supervisor is
    gone; None (a supervisor without a heartbeat): never"""
    servers: list[ServerEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeDiscovery:
        """The discovery file's record; ``RecordError`` names the field that is wrong and how."""
        return record_from_json(cls, text)

    def to_dict(self) -> dict[str, object]:
        """What the file holds, as JSON values."""
        return record_to_dict(self)

    def ready_servers(self) -> list[ServerEntry]:
        return [s for s in self.servers if s.state == "ready"]

    def age_s(self, now: float) -> float:
        """Seconds since the supervisor last wrote the file (negative after a clock step back)."""
        return now - self.updated_at

    def is_stale(self, now: float) -> bool:
        """Whether the heartbeat stopped: older than ``stale_after_s`` at wall-clock time ``now``."""
        return self.stale_after_s is not None and self.age_s(now) > self.stale_after_s


def default_runtime_dir() -> Path:
    """The runtime folder when nobody names one: ``/tmp/udfserve-<uid>``, this user's own.

    A folder of its own per user, as tmux's ``/tmp/tmux-<uid>``: a shared ``/tmp/udfserve``
    could be created first by another user, who would then own the node's sockets. Not
    ``$XDG_RUNTIME_DIR``: executors started by a cluster manager have no login session, so a node
    started from a shell and the executors of the same user would look in two places. Nodes
    shared by several users name a folder of their own (``--runtime-dir``, ``/run/udfserve`` in
    the deployment files).
    """
    return RUNTIME_DIR_PARENT / f"udfserve-{os.geteuid()}"


def default_discovery_path(environ: Mapping[str, str]) -> Path:
    """Where the discovery file is when nobody says otherwise."""
    if environ.get(DISCOVERY_FILE_ENV):
        return Path(environ[DISCOVERY_FILE_ENV])
    runtime_dir = environ.get(RUNTIME_DIR_ENV)
    return (Path(runtime_dir) if runtime_dir else default_runtime_dir()) / DISCOVERY_FILE_NAME


class UntrustedDiscoveryFile(DiscoveryError):
    """The discovery file, or a folder it lies in, could have been written by an untrusted user."""


TRUST_FIX = (
    "a node's files must belong to the reader's user, root, or a uid the client trusts "
    "(ClientConfig.trusted_node_uids, spark.udfserve.trustedNodeUids), in a folder only they can write"
)


def read_discovery(path: Path, trusted: frozenset[int] | None = None) -> NodeDiscovery:
    """Parse the discovery file at ``path``; raise DiscoveryError saying what is wrong, and
    ``UntrustedDiscoveryFile`` when a user outside ``trusted`` (default: this user and root)
    owns it or could have replaced it (``node_files``)."""
    try:
        raw = read_node_file(
            path, trusted if trusted is not None else trusted_uids(), "the discovery file", TRUST_FIX
        )
    except FileNotFoundError as exc:
        raise DiscoveryError(
            f"no discovery file at {path} (is `udfserve node` running on this node?)"
        ) from exc
    except UntrustedNodeFile as exc:
        raise UntrustedDiscoveryFile(f"refusing discovery file {path}: {exc}") from exc
    except OSError as exc:
        raise DiscoveryError(f"cannot read discovery file {path}: {exc}") from exc
    try:
        return NodeDiscovery.from_json(raw)
    except RecordError as exc:
        raise DiscoveryError(f"discovery file {path} is not valid: {exc}") from exc


def read_live_discovery(
    path: Path, now: float | None = None, trusted: frozenset[int] | None = None
) -> NodeDiscovery:
    """Like ``read_discovery``, and a file whose heartbeat stopped counts as absent: its servers
    died with their supervisor. ``now`` is the wall-clock time to judge by (default: now)."""
    discovery = read_discovery(path, trusted)
    now = time.time() if now is None else now
    if discovery.is_stale(now):
        raise DiscoveryError(
            f"discovery file {path} is stale: written {discovery.age_s(now):.1f} s ago by the supervisor "
            f"(pid {discovery.supervisor_pid}) of node {discovery.node or '?'}, which refreshes it every "
            f"{discovery.heartbeat_s} s; a file older than {discovery.stale_after_s} s is taken for "
            "absent (its supervisor and servers are gone; is `udfserve node` running on this node?)"
        )
    return discovery


def write_discovery(path: Path, discovery: NodeDiscovery) -> None:
    """Replace the file at ``path`` atomically, readable by everyone on the node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(discovery.to_dict(), indent=2, sort_keys=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
