"""In an executor: make sure this host runs a node, starting one where none runs (``node_servers``).

Two callers. The start stage of ``node_servers`` (in the driver's context) waits for the start
lock, starts or finds the node, and waits until it serves (``host_start.HostStarter``). A task of a UDF
built inside the context (``ensure_for_task``) never waits: it skips a lock another task holds,
and returns as soon as the node is started, so its rows go to the CPU fallback until the node is
ready, and to the node from the first batch after (the routing looks at the discovery file before
every batch).

On each host, under ``<runtime dir>/node-start.lock`` (``udfserve.node_leases`` says why), a
caller writes its application's lease file if absent, probes the node's own lock
(``node.lock``) to see whether a supervisor runs, and, where none does, starts ``udfserve node
--leases`` through the detached launcher (``python -m udfserve.services.node.detached``: a
session of its own, its output in ``<runtime dir>/logs/node.log``), handing it the start lock,
which the node closes once it holds its own: nobody starts a second node meanwhile. The Python
worker's reuse, the end of its task or a signal to its process group do not reach the node; the
node stops when no application holds a lease on it.

The runtime folder is made and checked as the node makes and checks it (``node_files``): the
executor's user owns it, and no one else may write it or the lease folder in it. Nothing here
imports the server side; it only starts it as a command. Nothing here reads ``os.environ``:
callers pass the task's environment.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from udfserve.discovery import (
    DISCOVERY_FILE_NAME,
    RUNTIME_DIR_ENV,
    DiscoveryError,
    default_discovery_path,
    default_runtime_dir,
    read_live_discovery,
)
from udfserve.node_files import UntrustedNodeFile, check_folder, trusted_uids
from udfserve.node_leases import (
    NODE_LOCK_FILE,
    START_LOCK_FILE,
    ask_holder,
    lease_file,
    prepare_lease_folder,
    write_lease,
)
from udfserve.spark_client.common.node_start import NodeStart

logger = logging.getLogger(__name__)

SERVER_PACKAGE = "udfserve.services.node"
LAUNCHER_MODULE = "udfserve.services.node.detached"
NODE_LOG = "logs/node.log"
TASK_VARIABLES = frozenset(
    {
        "OMP_NUM_THREADS",
        "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE",
        "PYTHON_UDF_BATCH_SIZE",
        "SPARK_PYTHON_RUNTIME",
        "SPARK_REUSE_WORKER",
        "SPARK_BUFFER_SIZE",
        "SPARK_AUTH_SOCKET_TIMEOUT",
    }
)
WORKER_FACTORY_PREFIX = "PYTHON_WORKER_FACTORY_"
"""What Spark sets for one Python worker and the node must not inherit: its worker factory's
secret and socket (``PYTHON_WORKER_FACTORY_*``), and ``OMP_NUM_THREADS`` (``spark.task.cpus``, 1
by default), which would hold a CPU server's framework to one thread where a node installed on
the host has every core."""
PRIVATE_MODE = 0o700
SHARED_MODE = 0o755
LAUNCH_TIMEOUT_S = 60.0
HOLDER_TIMEOUT_S = 5.0
RUNTIME_FIX = (
    "remove it, or give it to the executors' user and take the write permission of group and others "
    "away, or name another runtime folder (node_servers(runtime_dir=...), UDFSERVE_RUNTIME_DIR)"
)

Action = Literal["running", "started", "busy", "released", "unreachable"]


class NodeStartError(RuntimeError):
    """A host's node could not be started or found serving; the message names the host and why."""


@dataclass(frozen=True)
class HostCheck:
    """What one call found on its host.

    ``action``: ``running`` (a node runs; its pid from its lock), ``started`` (this call started
    it), ``busy`` (another task holds the start lock: nothing checked), ``released`` (the
    application's lease is released: nothing started), ``unreachable`` (the lease's holder did not
    answer: nothing started)."""

    runtime_dir: Path
    discovery_file: Path
    action: Action
    pid: int | None = None
    detail: str = ""


def runtime_dir_of(start: NodeStart, environ: Mapping[str, str]) -> Path:
    """This host's runtime folder: the context's, else the executor's ``UDFSERVE_RUNTIME_DIR``,
    else ``/tmp/udfserve-<uid>``; the one a node installed there would use."""
    if start.runtime_dir:
        return Path(start.runtime_dir)
    return Path(environ[RUNTIME_DIR_ENV]) if environ.get(RUNTIME_DIR_ENV) else default_runtime_dir()


def discovery_file_of(start: NodeStart, environ: Mapping[str, str]) -> Path:
    """Where this host's node writes its discovery file, as the client's routing looks for it."""
    if start.runtime_dir:
        return Path(start.runtime_dir) / DISCOVERY_FILE_NAME
    return default_discovery_path(environ)


def ensure_node(start: NodeStart, environ: Mapping[str, str], *, lock_wait_s: float) -> HostCheck:
    """Find or start this host's node for ``start``'s application, under the start lock.

    ``lock_wait_s``: how long to wait for the start lock (0: skip it when taken). Before starting
    a node, the lease's holder is asked whether it holds the lease: a node is started only for a
    lease held, never for a released one (a UDF used after its context ended) nor for a holder
    this executor cannot reach (the node would stop after ``lease_timeout_s``). Raises
    ``NodeStartError`` when the runtime folder is refused or the node cannot be launched.
    """
    runtime_dir = runtime_dir_of(start, environ)
    discovery_file = discovery_file_of(start, environ)
    me, trusted = frozenset({os.geteuid()}), trusted_uids()
    mode = PRIVATE_MODE if runtime_dir == default_runtime_dir() else SHARED_MODE
    try:
        os.makedirs(runtime_dir, mode=mode, exist_ok=True)
        check_folder(runtime_dir, trusted, "the node's runtime folder", RUNTIME_FIX, owners=me)
        prepare_lease_folder(runtime_dir, me, trusted)
    except (UntrustedNodeFile, OSError) as exc:
        raise NodeStartError(f"cannot use the node's runtime folder {runtime_dir}: {exc}") from None
    lock_fd = _take_lock(runtime_dir / START_LOCK_FILE, lock_wait_s)
    if lock_fd is None:
        return HostCheck(runtime_dir, discovery_file, "busy", detail="another task holds the start lock")
    try:
        lease = start.lease
        if not lease_file(runtime_dir, lease.lease_id).exists():
            write_lease(runtime_dir, lease, me, trusted)
        running, pid = _node_running(runtime_dir)
        if running:
            return HostCheck(runtime_dir, discovery_file, "running", pid)
        answer, detail = ask_holder(lease, timeout_s=HOLDER_TIMEOUT_S)
        if answer == "released":
            lease_file(runtime_dir, lease.lease_id).unlink(missing_ok=True)
            return HostCheck(runtime_dir, discovery_file, "released", detail=detail)
        if answer == "unanswered":
            return HostCheck(runtime_dir, discovery_file, "unreachable", detail=detail)
        pid = _launch(start, runtime_dir, lock_fd, environ, mode)
        return HostCheck(runtime_dir, discovery_file, "started", pid)
    finally:
        os.close(lock_fd)  # a node just started holds its copy until it has its own lock


_warned: set[str] = set()


def ensure_for_task(start: NodeStart, environ: Mapping[str, str]) -> HostCheck | None:
    """At a task's start: make sure the host runs a node, never waiting for one, never failing
    the task (a problem is logged once per Python worker, and the rows go to the CPU fallback).

    The quick path, taken while the node runs and holds this application's lease, costs a
    ``stat`` and one read of the discovery file: no lock."""
    runtime_dir = runtime_dir_of(start, environ)
    if lease_file(runtime_dir, start.lease.lease_id).exists():
        try:
            read_live_discovery(discovery_file_of(start, environ), trusted=trusted_uids())
            return None
        except DiscoveryError:
            pass
    try:
        check = ensure_node(start, environ, lock_wait_s=0.0)
    except NodeStartError as exc:
        _warn_once(f"udfserve: this host's node could not be started; rows go to the CPU fallback: {exc}")
        return None
    if check.action == "started":
        logger.info(
            "udfserve: started this host's node (pid %d, runtime folder %s); rows go to the CPU fallback "
            "until it serves",
            check.pid,
            check.runtime_dir,
        )
    elif check.action == "unreachable":
        _warn_once(
            f"udfserve: not starting this host's node: the lease's holder did not answer ({check.detail})"
        )
    return check


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


def _take_lock(path: Path, wait_s: float) -> int | None:
    """A descriptor holding ``path``'s exclusive flock, or None if not had within ``wait_s``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def _node_running(runtime_dir: Path) -> tuple[bool, int | None]:
    """Whether a supervisor holds the node's lock, and its pid as the lock file says. Probed only
    under the start lock: a node starts only under it, so the probe never races a starting one."""
    fd = os.open(runtime_dir / NODE_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            return True, int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)


def _launch(start: NodeStart, runtime_dir: Path, lock_fd: int, environ: Mapping[str, str], mode: int) -> int:
    """Start ``udfserve node`` detached, handing it the start lock; its pid."""
    if importlib.util.find_spec(SERVER_PACKAGE) is None:
        raise NodeStartError(
            f"cannot start a node on {socket.gethostname()}: {sys.executable} has no udfserve server side "
            f"({SERVER_PACKAGE}); install udfserve[server] on every host, in the executors' Python"
        )
    log = runtime_dir / NODE_LOG
    os.makedirs(log.parent, mode=mode, exist_ok=True)
    node = [sys.executable, "-m", "udfserve", "node", *start.node_arguments(runtime_dir, lock_fd)]
    command = [sys.executable, "-m", LAUNCHER_MODULE, "--log-file", str(log), "--", *node]
    try:
        launched = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            pass_fds=(lock_fd,),
            env=node_environment(environ),
            timeout=LAUNCH_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeStartError(f"cannot start a node on {socket.gethostname()}: {exc}") from None
    output = launched.stdout.decode(errors="replace").strip()
    if launched.returncode != 0 or not output.isdigit():
        stderr = launched.stderr.decode(errors="replace").strip()[-2000:]
        raise NodeStartError(
            f"cannot start a node on {socket.gethostname()}: the launcher exited {launched.returncode}: "
            f"{stderr}"
        )
    return int(output)


def node_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The node's environment: the executor's (its ``UDFSERVE_*`` settings configure the node as
    they would one installed there) less what Spark set for this Python worker alone."""
    return {
        name: value
        for name, value in environ.items()
        if name not in TASK_VARIABLES and not name.startswith(WORKER_FACTORY_PREFIX)
    }


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in {"Z", "X"}


def log_tail(runtime_dir: Path, lines: int = 20) -> str:
    try:
        text = (runtime_dir / NODE_LOG).read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])
