"""The node's runtime folder: created private, and refused when another user could write it.

The folder holds the unix sockets that executors send a job's rows to and the discovery file
that tells them which sockets those are. A folder that already exists but belongs to another
user, or that the group or others may write, lets that user replace the sockets with their own
(and read every row), so the node refuses to start in it rather than adopt it
(``udfserve.node_files`` holds the rule, which the Spark client applies when it reads).
"""

from __future__ import annotations

import os
from pathlib import Path

from udfserve.node_files import UntrustedNodeFile, check_folder, trusted_uids

PRIVATE_MODE = 0o700
"""The default folder (``/tmp/udfserve-<uid>``): only its user's executors use it."""
SHARED_MODE = 0o755
"""A folder named on the command line: executors of other users may need to reach its sockets."""


class RuntimeDirRefused(RuntimeError):
    """The runtime folder (or the discovery file's) is not the node's own; the message says why."""


def prepare_runtime_dir(folder: Path, mode: int, what: str = "the runtime folder") -> None:
    """Create ``folder`` with ``mode`` if absent, then check it and the folders above it."""
    if not folder.exists():
        try:
            os.makedirs(folder, mode=mode, exist_ok=True)
        except OSError as exc:
            raise RuntimeDirRefused(f"cannot create {what} {folder}: {exc}") from None
    me = os.geteuid()
    fix = (
        f"remove it, or give it to this user and take the write permission of group and others away "
        f"(chown {me} {folder}; chmod go-w {folder}), or choose another --runtime-dir"
    )
    try:
        check_folder(folder, trusted_uids(), what, fix, owners=frozenset({me}))
    except (UntrustedNodeFile, FileNotFoundError) as exc:
        raise RuntimeDirRefused(str(exc)) from None
