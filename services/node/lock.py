"""One supervisor per runtime folder: an exclusive ``flock`` on ``<runtime dir>/node.lock``.

Two supervisors on one node would start two servers per GPU and overwrite each other's
discovery file. The kernel drops an ``flock`` when its holder dies, however it dies, so a
crashed supervisor never leaves the node locked. The file keeps the holder's pid only so the
refusal can name it; it is not deleted on release, because deleting a lock file lets a third
process lock a fresh inode while a second still waits on the old one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class NodeLockHeld(RuntimeError):
    """Another supervisor holds the node's lock."""


class NodeLock:
    """An exclusive, non-blocking lock on ``path`` holding the owner's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise NodeLockHeld naming the file and the pid that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise NodeLockHeld(
                f"another udfserve node supervisor (pid {holder}) holds the lock {self.path}; "
                "stop it first, or give this one another --runtime-dir (and another "
                "--supervisor-http-port)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> NodeLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
