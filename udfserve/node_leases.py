"""Leases on a node that Spark jobs started: which applications still need it, and how it asks them.

Where nothing can be installed on the hosts, a Spark application starts ``udfserve node`` itself
(``udfserve.spark_client.node_servers``), and the node must not outlive the applications that
use it. Each application context holds a **lease**: its driver serves a small HTTP endpoint, and
its executors write a lease file naming that endpoint into the runtime folder of every host they
run on. A node started with ``--leases`` asks each lease's holder, every poll, whether it still
holds the lease, and stops once none is held. Several applications on one host share its node
(one node per host: its servers are every application's); the node stays while any of them
holds a lease.

The files, in the node's runtime folder:

- ``leases/<lease id>.json``: one per application context using the node. Written by that
  application's tasks (atomically, mode 0600, in a folder of mode 0700), removed by the node once
  the holder says the lease is released or has not answered for ``--lease-timeout-s``. The node
  reads only files that pass ``node_files``' rule for its own user (the folder and file its
  user's or root's, writable by no one else): a lease names an address the node will poll, and
  another user must not keep a node alive, or make it poll their address.
- ``node-start.lock``: ``flock``ed by whoever checks for a node or starts one (an executor's
  task), and by a node from the moment it finds no lease held until it has exited. A task that
  writes its lease under this lock, and sees a node running, knows that node has not yet
  decided to stop, and will read the new lease before it does.
- ``node.lock``: the supervisor's own lock (``services/node/lock.py``); a task probes it, under
  the start lock only, to see whether a node runs.

What a holder answers, for ``GET /udfserve/lease/<lease id>``: ``200 {"lease_id": ..., "held":
true}`` while it holds it; ``410`` (or ``held: false``) once released; ``404`` for a lease it does
not know (another process took the port of a driver that died). Nothing here reads
``os.environ``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlencode

from udfserve.node_files import UntrustedNodeFile, check_folder, read_node_file
from udfserve.records import RecordError, check_fields, record_from_json, record_to_dict

LEASES_FOLDER = "leases"
START_LOCK_FILE = "node-start.lock"
NODE_LOCK_FILE = "node.lock"
LEASE_PATH_PREFIX = "/udfserve/lease/"
LEASE_FOLDER_MODE = 0o700
LEASE_FILE_MODE = 0o600
LEASE_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")

HolderAnswer = Literal["held", "released", "unanswered"]

LEASE_FIX = (
    "the lease folder and its files must belong to the node's user (or root) and be writable by no "
    "one else; remove the folder to have it made again"
)


@dataclass(frozen=True)
class Lease:
    """One application context's claim on a node, as its tasks write it (a plain record: the tasks
    that write it import no pydantic, ``udfserve.records``)."""

    lease_id: str
    """random, 128 bits, hex"""
    holder_host: str
    """host of the holder's HTTP endpoint (its driver)"""
    holder_port: int
    application: str = ""
    """the Spark application id, for the logs"""
    app_name: str = ""
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        check_fields(self)
        if not LEASE_ID_PATTERN.match(self.lease_id):
            raise RecordError(f"Lease.lease_id: expected 32 lowercase hex digits, received {self.lease_id!r}")
        if not self.holder_host:
            raise RecordError("Lease.holder_host: expected the holder's host, received an empty string")
        if not 1 <= self.holder_port <= 65535:
            raise RecordError(
                f"Lease.holder_port: expected a port from 1 to 65535, received {self.holder_port}"
            )

    @classmethod
    def from_json(cls, text: str | bytes) -> Lease:
        """The lease a lease file holds; ``RecordError`` names what is wrong in it."""
        return record_from_json(cls, text)

    def to_json(self) -> str:
        return json.dumps(record_to_dict(self))

    @property
    def holder(self) -> str:
        """``host:port`` of the holder, IPv6 hosts bracketed."""
        host = f"[{self.holder_host}]" if ":" in self.holder_host else self.holder_host
        return f"{host}:{self.holder_port}"

    @property
    def path(self) -> str:
        return LEASE_PATH_PREFIX + self.lease_id


def lease_folder(runtime_dir: Path) -> Path:
    return runtime_dir / LEASES_FOLDER


def lease_file(runtime_dir: Path, lease_id: str) -> Path:
    return lease_folder(runtime_dir) / f"{lease_id}.json"


def prepare_lease_folder(runtime_dir: Path, owners: frozenset[int], trusted: frozenset[int]) -> Path:
    """The lease folder of ``runtime_dir``, created 0700 if absent, refused (``UntrustedNodeFile``)
    unless one of ``owners`` owns it and no one else may write it or a folder above it."""
    folder = lease_folder(runtime_dir)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, LEASE_FOLDER_MODE)
    check_folder(folder, trusted, "the lease folder", LEASE_FIX, owners=owners)
    return folder


def write_lease(runtime_dir: Path, lease: Lease, owners: frozenset[int], trusted: frozenset[int]) -> Path:
    """Write ``lease`` into the runtime folder, atomically, readable by its user alone."""
    folder = prepare_lease_folder(runtime_dir, owners, trusted)
    target = lease_file(runtime_dir, lease.lease_id)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{lease.lease_id}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(lease.to_json())
        os.chmod(tmp_name, LEASE_FILE_MODE)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


@dataclass
class LeaseReading:
    """The leases of a runtime folder, and the files refused (each with why)."""

    leases: dict[str, Lease] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)


def read_leases(runtime_dir: Path, owners: frozenset[int], trusted: frozenset[int]) -> LeaseReading:
    """Every lease file of ``runtime_dir`` that passes the ownership rule and parses; a folder that
    does not exist holds none. Raises ``UntrustedNodeFile`` when the folder itself is refused."""
    folder = lease_folder(runtime_dir)
    reading = LeaseReading()
    try:
        check_folder(folder, trusted, "the lease folder", LEASE_FIX, owners=owners)
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return reading
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue  # a file being written, or not a lease
        path = folder / name
        try:
            text = read_node_file(path, trusted, f"lease file {name}", LEASE_FIX)
            lease = Lease.from_json(text)
        except FileNotFoundError:
            continue  # removed since the listing
        except (UntrustedNodeFile, RecordError, OSError) as exc:
            reading.refused.append(f"{path}: {exc}")
            continue
        if f"{lease.lease_id}.json" != name:
            reading.refused.append(f"{path}: holds lease {lease.lease_id}, expected the file's name")
            continue
        reading.leases[lease.lease_id] = lease
    return reading


def holder_answer(lease_id: str, held: bool) -> bytes:
    """The body a holder answers for one of its leases."""
    return json.dumps({"lease_id": lease_id, "held": held}).encode()


def ask_holder(
    lease: Lease, *, timeout_s: float, node: str = "", pid: int | None = None
) -> tuple[HolderAnswer, str]:
    """Whether the holder of ``lease`` still holds it, and the detail of an answer that is not
    ``held``. A node says who asks (its name and pid): when the holder releases the lease, it waits
    for the nodes that asked before to ask again. No proxy is used: the holder is dialled directly."""
    query = f"?{urlencode({'node': node, 'pid': pid})}" if node and pid is not None else ""
    connection = http.client.HTTPConnection(lease.holder_host, lease.holder_port, timeout=timeout_s)
    try:
        connection.request("GET", f"{lease.path}{query}")
        response = connection.getresponse()
        body = response.read(4096)
    except (OSError, http.client.HTTPException) as exc:
        return "unanswered", f"{lease.holder}: {exc}"
    finally:
        connection.close()
    if response.status in (404, 410):
        return "released", f"{lease.holder} answered {response.status}"
    if response.status != 200:
        return "unanswered", f"{lease.holder} answered {response.status}"
    try:
        answer = json.loads(body)
        matches = answer["lease_id"] == lease.lease_id
        held = answer["held"] is True
    except (ValueError, KeyError, TypeError):
        return "unanswered", f"{lease.holder} answered 200 with no lease in its body"
    if not matches:
        return "released", f"{lease.holder} answered for another lease"
    return ("held", "") if held else ("released", f"{lease.holder} says the lease is released")
