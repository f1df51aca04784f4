"""The discovery file and the supervisor that writes it: present, trusted, fresh, and alive.

The file is read as the client reads it (``read_discovery``, with the ownership checks of
``node_files``), and judged fresh as the client judges it (``NodeDiscovery.is_stale``). Whether
its supervisor lives is asked of the kernel, not of a pid: the supervisor holds an ``flock`` on
``<runtime dir>/node.lock`` for as long as it runs (``services/node/lock.py``), which the kernel
drops however it dies. ``/proc/locks`` names the holder when it runs in this PID namespace; it
lists nothing for a holder in another one (a node in its own container, read from an executor's
container that mounts the node's folder), nor for no holder at all. Only then is the lock
tried, shared and without waiting, and let go at once: a holder makes the try fail. A supervisor
that starts in that very instant is refused (another process holds the lock) and is started
again by its service manager; that is the price of telling a dead node from one next door.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from udfserve.discovery import DiscoveryError, NodeDiscovery, UntrustedDiscoveryFile, read_discovery
from udfserve.node_files import describe_uid, trusted_uids
from udfserve.node_leases import NODE_LOCK_FILE
from udfserve.services.doctor.config import DoctorConfig
from udfserve.services.doctor.report import Finding
from udfserve.spark_client.nodes.node_ensure import process_alive
from udfserve.spark_client.nodes.routing import ADDRESS_ENV

PROC_LOCKS = Path("/proc/locks")
RESTART_FIX = (
    "start the node again (`udfserve node ...`); run it under a service manager that restarts it "
    "(systemd Restart=always, a Kubernetes DaemonSet) so that this does not last"
)


def check_node(
    config: DoctorConfig, environ: Mapping[str, str], now: float | None = None
) -> tuple[list[Finding], NodeDiscovery | None]:
    """The findings about the discovery file and its supervisor, and the file when it can be read."""
    findings: list[Finding] = []
    if environ.get(ADDRESS_ENV):
        findings.append(
            Finding(
                group="discovery",
                name=ADDRESS_ENV,
                status="info",
                summary=f"{ADDRESS_ENV}={environ[ADDRESS_ENV]} is set: jobs that run here dial that address "
                "and never read the discovery file (unless their config names another address)",
            )
        )
    path = config.discovery_path
    try:
        discovery = read_discovery(path, trusted_uids(config.trusted_node_uids))
    except UntrustedDiscoveryFile as exc:
        findings.append(
            Finding(
                group="discovery",
                name="discovery file",
                status="fail",
                summary=f"{exc}. The client refuses it just as this check did, so jobs here send every row "
                "to the CPU fallback",
                fix="give the folder and the file to the node's user and take the write permission of group "
                "and others away (chmod go-w), or, for a node run by a service user, trust its uid "
                "(--trusted-node-uids here, spark.udfserve.trustedNodeUids in the jobs)",
                facts={"path": str(path)},
            )
        )
        return findings, None
    except DiscoveryError as exc:
        missing = isinstance(exc.__cause__, FileNotFoundError)
        findings.append(
            Finding(
                group="discovery",
                name="discovery file",
                status="fail",
                summary=f"{exc}; jobs here find no server and send every row to the CPU fallback",
                fix=(
                    "start `udfserve node` on this host, or point this check and the executors at the node's "
                    "runtime folder (--runtime-dir here, UDFSERVE_RUNTIME_DIR or "
                    "spark.udfserve.discoveryFile "
                    "in the jobs)"
                    if missing
                    else "the file is the node's own: stop whatever else writes there, and restart the node"
                ),
                facts={"path": str(path), "present": not missing},
            )
        )
        return findings, None
    owner = describe_uid(os.stat(path).st_uid)
    findings.append(
        Finding(
            group="discovery",
            name="discovery file",
            status="ok",
            summary=f"{path}, written by {owner}, in a folder only trusted users can write: node "
            f"{discovery.node or '?'}, {len(discovery.servers)} server(s), repository "
            f"{discovery.model_repository or '(not named)'}",
            facts={
                "path": str(path),
                "node": discovery.node,
                "owner": owner,
                "model_repository": discovery.model_repository,
                "servers": len(discovery.servers),
            },
        )
    )
    supervisor = supervisor_state(config.runtime_folder / NODE_LOCK_FILE, discovery.supervisor_pid)
    now = time.time() if now is None else now
    findings.append(_heartbeat(discovery, now, supervisor))
    findings.append(_supervisor(discovery, supervisor, now))
    return findings, discovery


@dataclass(frozen=True)
class SupervisorState:
    """What the kernel says about the supervisor: its lock and its process."""

    lock_path: Path
    lock_held: bool | None
    """Whether a process holds the node's lock; None when the lock cannot be looked at."""
    holders: tuple[int, ...]
    """The holders' pids, when they run in this PID namespace (``/proc/locks``)."""
    pid: int | None
    alive: bool
    process_state: str
    """``R``, ``S``, ``T`` (stopped) ... from ``/proc/<pid>/stat``; "" when unknown."""


def supervisor_state(lock_path: Path, pid: int | None) -> SupervisorState:
    holders: tuple[int, ...] = ()
    try:
        found = os.stat(lock_path)
    except OSError:
        held = None
    else:
        listed = flock_holders(os.major(found.st_dev), os.minor(found.st_dev), found.st_ino) or ()
        holders = tuple(holder for holder in listed if holder > 0)  # 0: a pid this namespace cannot see
        held = True if holders else lock_taken(lock_path)
    alive = pid is not None and process_alive(pid)
    return SupervisorState(lock_path, held, holders, pid, alive, _process_state(pid) if alive else "")


def lock_taken(path: Path) -> bool | None:
    """Whether a process holds an exclusive ``flock`` on ``path``: tried shared, without waiting,
    and let go at once; None when the file cannot be opened."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)


def flock_holders(major: int, minor: int, inode: int) -> tuple[int, ...] | None:
    """The pids holding an ``flock`` on the file (``major:minor:inode``), as ``/proc/locks`` lists
    them (holders in other PID namespaces are not listed); None when it cannot be read. A file
    system that reports another device number in ``/proc/locks`` than in ``stat`` (an overlay) is
    matched on the inode alone."""
    try:
        text = PROC_LOCKS.read_text()
    except OSError:
        return None
    exact: list[int] = []
    same_inode: list[int] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK":
            continue  # a waiter, or a POSIX/OFD lock: the supervisor's is an flock
        device = fields[5].split(":")
        if len(device) != 3 or not fields[4].lstrip("-").isdigit():
            continue
        try:
            where = (int(device[0], 16), int(device[1], 16), int(device[2]))
        except ValueError:
            continue
        holder = int(fields[4])
        if where == (major, minor, inode):
            exact.append(holder)
        elif where[2] == inode:
            same_inode.append(holder)
    return tuple(exact or same_inode)


def _process_state(pid: int | None) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _heartbeat(discovery: NodeDiscovery, now: float, supervisor: SupervisorState) -> Finding:
    age = discovery.age_s(now)
    facts = {
        "age_s": round(age, 3),
        "heartbeat_s": discovery.heartbeat_s,
        "stale_after_s": discovery.stale_after_s,
    }
    if discovery.stale_after_s is None:
        return Finding(
            group="discovery",
            name="heartbeat",
            status="warn",
            summary=f"written {age:.1f} s ago by a supervisor that writes no heartbeat: clients cannot tell "
            "its file from the file of a node that was killed",
            fix="run a udfserve node of this version",
            facts=facts,
        )
    if not discovery.is_stale(now):
        return Finding(
            group="discovery",
            name="heartbeat",
            status="ok",
            summary=f"written {age:.1f} s ago (refreshed every {discovery.heartbeat_s:g} s; taken for absent "
            f"after {discovery.stale_after_s:g} s)",
            facts=facts,
        )
    if supervisor.alive and supervisor.process_state == "T":
        fix = (
            f"the supervisor (pid {supervisor.pid}) is stopped: `kill -CONT {supervisor.pid}`, or restart "
            "the node"
        )
    elif supervisor.alive or supervisor.lock_held:
        fix = (
            f"the supervisor (pid {supervisor.pid}) runs but no longer writes: look at its log (its "
            "stderr: the journal, the container's log; logs/node.log of the runtime folder for a node a job "
            "started), and restart the node"
        )
    else:
        fix = RESTART_FIX
    return Finding(
        group="discovery",
        name="heartbeat",
        status="fail",
        summary=f"stale: written {age:.1f} s ago, while the supervisor refreshes it every "
        f"{discovery.heartbeat_s:g} s and clients take a file older than {discovery.stale_after_s:g} s for "
        "absent; jobs here find no server and send every row to the CPU fallback",
        fix=fix,
        facts=facts,
    )


def _supervisor(discovery: NodeDiscovery, supervisor: SupervisorState, now: float) -> Finding:
    pid = discovery.supervisor_pid
    facts = {
        "pid": pid,
        "lock": str(supervisor.lock_path),
        "lock_held": supervisor.lock_held,
        "lock_holders": list(supervisor.holders),
        "alive": supervisor.alive,
        "process_state": supervisor.process_state,
    }
    held = supervisor.lock_held
    if held is False:
        gone = "" if supervisor.alive else f", and no process has pid {pid}"
        return Finding(
            group="discovery",
            name="supervisor",
            status="fail",
            summary=f"no process holds the node's lock {supervisor.lock_path}: the supervisor that wrote the "
            f"file (pid {pid}) is gone{gone}; its servers stop with it, and clients keep dialling them"
            f"{_until_stale(discovery)}",
            fix=RESTART_FIX,
            facts=facts,
        )
    if supervisor.alive and supervisor.process_state == "T":
        return Finding(
            group="discovery",
            name="supervisor",
            status="fail",
            summary=f"pid {pid} holds the node's lock but is stopped (SIGSTOP, a debugger): it neither "
            "refreshes the discovery file nor restarts a server that dies",
            fix=f"`kill -CONT {pid}`, or restart the node",
            facts=facts,
        )
    if held:
        holders = supervisor.holders
        if pid is not None and pid in holders:
            summary = f"pid {pid} runs and holds the node's lock {supervisor.lock_path}"
        elif not holders:
            summary = (
                f"a process of another PID namespace holds the node's lock {supervisor.lock_path} (the "
                f"supervisor, pid {pid} in its own): the node runs in another container"
            )
        else:
            return Finding(
                group="discovery",
                name="supervisor",
                status="warn",
                summary=f"the node's lock {supervisor.lock_path} is held by pid "
                f"{', '.join(map(str, holders))}, "
                f"not by pid {pid}, which the discovery file names",
                fix="two nodes share this runtime folder or its files: give each its own --runtime-dir",
                facts=facts,
            )
        return Finding(group="discovery", name="supervisor", status="ok", summary=summary, facts=facts)
    if supervisor.alive:
        return Finding(
            group="discovery",
            name="supervisor",
            status="ok",
            summary=f"pid {pid} runs (its lock {supervisor.lock_path} could not be looked at from here)",
            facts=facts,
        )
    if discovery.is_stale(now):
        return Finding(
            group="discovery",
            name="supervisor",
            status="fail",
            summary=f"pid {pid}, which wrote the file, does not run here and its heartbeat stopped",
            fix=RESTART_FIX,
            facts=facts,
        )
    return Finding(
        group="discovery",
        name="supervisor",
        status="info",
        summary=f"pid {pid} does not run in this PID namespace and its lock {supervisor.lock_path} is not "
        "visible here; the fresh heartbeat says it runs elsewhere (another container)",
        facts=facts,
    )


def _until_stale(discovery: NodeDiscovery) -> str:
    if discovery.stale_after_s is None:
        return ""
    return f" until the file is {discovery.stale_after_s:g} s old"
