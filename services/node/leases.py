"""``udfserve node --leases``: the node runs while some Spark application holds a lease on it.

A node that a Spark job started (``udfserve.spark_client.node_servers``) has no service manager
to stop it: its owners are the applications whose lease files lie in ``<runtime dir>/leases``
(``udfserve.node_leases`` holds the format and the ownership rule). Every ``--lease-poll-s`` the
watch asks each lease's holder (the application's driver) whether it still holds it; a lease
released by its holder is dropped at once, one whose holder has not answered for
``--lease-timeout-s`` (a driver killed, a host gone) is dropped then. A lease first seen gets
that long to answer, counted from when the node first read it.

When no lease is held, the watch takes the start lock (``node-start.lock``) and reads the folder
again: a task that wrote its lease meanwhile, under that lock, keeps the node. Otherwise the
node keeps the start lock until it has exited, and stops as on SIGTERM: a task that comes now
waits for, or skips, the lock, and then finds no node and starts a new one, instead of writing
its lease for a node about to exit.

The starter's lock (``--starter-lock-fd``): the task that starts a node holds the start lock
and passes its descriptor on; the node closes it once it holds its own lock, so no second node
is started on the host while the first one starts up.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from udfserve.node_files import UntrustedNodeFile, trusted_uids
from udfserve.node_leases import START_LOCK_FILE, Lease, ask_holder, lease_file, read_leases

logger = logging.getLogger(__name__)

START_LOCK_WAIT_S = 10.0
"""How long the watch waits for the start lock before it looks at the leases again (a task holds
it for milliseconds; a node starting up, until it holds its own lock)."""


@dataclass
class _Tracked:
    lease: Lease
    answered_at: float
    """Monotonic time of the holder's last 'held', or of when the node first read the lease."""
    state: str = "new"


class LeaseWatch:
    """The leases of one node's runtime folder and what their holders last answered."""

    def __init__(self, runtime_dir: Path, node: str, poll_s: float, timeout_s: float) -> None:
        self.runtime_dir = runtime_dir
        self.node = node
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._owners = frozenset({os.geteuid()})
        self._trusted = trusted_uids()
        self._tracked: dict[str, _Tracked] = {}
        self._snapshot: list[dict[str, object]] = []
        self._start_lock_fd: int | None = None

    async def run(self, on_none_held: Callable[[], None]) -> None:
        """Poll until no lease is held, then call ``on_none_held`` once, holding the start lock."""
        while True:
            await asyncio.to_thread(self.poll_once)
            if not self._tracked and await asyncio.to_thread(self._hold_start_lock_if_none_held):
                on_none_held()
                return
            await asyncio.sleep(self.poll_s)

    def poll_once(self) -> None:
        """Read the lease files, ask every holder, drop the leases released or not answered."""
        now = time.monotonic()
        found = self._read()
        for lease_id in list(self._tracked):
            if lease_id not in found:
                logger.info("lease %s is gone from %s", lease_id, self.runtime_dir)
                del self._tracked[lease_id]
        for lease_id, lease in found.items():
            if lease_id not in self._tracked:
                logger.info(
                    "lease %s of application %s (%s), holder %s",
                    lease_id,
                    lease.application or "?",
                    lease.app_name or "?",
                    lease.holder,
                )
                self._tracked[lease_id] = _Tracked(lease, now)
        for tracked in list(self._tracked.values()):
            answer, detail = ask_holder(
                tracked.lease, node=self.node, pid=os.getpid(), timeout_s=min(max(self.poll_s, 1.0), 5.0)
            )
            now = time.monotonic()
            if answer == "held":
                tracked.answered_at, tracked.state = now, "held"
            elif answer == "released":
                self._drop(tracked, f"released by its holder ({detail})")
            elif now - tracked.answered_at > self.timeout_s:
                self._drop(tracked, f"its holder has not answered for {self.timeout_s:g} s (last: {detail})")
            else:
                tracked.state = f"unanswered for {now - tracked.answered_at:.0f} s: {detail}"
        self._snapshot = [
            {
                "lease_id": t.lease.lease_id,
                "application": t.lease.application,
                "app_name": t.lease.app_name,
                "holder": t.lease.holder,
                "state": t.state,
            }
            for t in self._tracked.values()
        ]

    def describe(self) -> list[dict[str, object]]:
        """The leases held or awaiting an answer, as of the last poll (for ``/health/ready``)."""
        return list(self._snapshot)

    def close(self) -> None:
        """Let go of the start lock (after the node released its own lock)."""
        if self._start_lock_fd is not None:
            os.close(self._start_lock_fd)
            self._start_lock_fd = None

    def _read(self) -> dict[str, Lease]:
        try:
            reading = read_leases(self.runtime_dir, self._owners, self._trusted)
        except UntrustedNodeFile as exc:
            logger.warning("not reading the leases: %s", exc)
            return {}
        for problem in reading.refused:
            logger.warning("ignoring a lease file: %s", problem)
        return reading.leases

    def _drop(self, tracked: _Tracked, why: str) -> None:
        lease = tracked.lease
        logger.info("dropping lease %s of application %s: %s", lease.lease_id, lease.application or "?", why)
        lease_file(self.runtime_dir, lease.lease_id).unlink(missing_ok=True)
        del self._tracked[lease.lease_id]

    def _hold_start_lock_if_none_held(self) -> bool:
        """Under the start lock, whether the folder still holds no lease; if so the lock is kept."""
        fd = os.open(self.runtime_dir / START_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + START_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        if self._read():
            os.close(fd)  # a task wrote its lease meanwhile: the next poll asks its holder
            return False
        self._start_lock_fd = fd
        return True


def release_starter_lock(fd: int | None) -> None:
    """Close the start lock the node's starter passed on (``--starter-lock-fd``)."""
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError as exc:
        logger.warning("--starter-lock-fd %d could not be closed: %s", fd, exc.strerror)
