"""Whether a file of the node can be trusted: who owns it, and who could have replaced it.

The node supervisor writes a runtime folder (discovery file, unix sockets, ready files) that the
Spark client reads and dials. A file there decides which process receives a job's rows, and, if
the client took its repository from it, which model files run inside the job. Another local
user who can write that folder, or who created it first, could otherwise forge both.

The rule is the one OpenSSH (``StrictModes``), sudo and tmux apply to their own files:

- the file, and the folder holding it, belong to a trusted user: the reader's own user, root,
  or a uid the reader was told to trust (a node run by a service user);
- neither the file nor its folder is writable by the group or by others;
- every folder above belongs to a trusted user and is not writable by others, unless it has the
  sticky bit (``/tmp``, ``/dev/shm``): there nobody but an entry's owner can rename or remove it;
- the file is read through a descriptor opened without following a symbolic link, and checked
  on that descriptor, so it cannot be swapped between the check and the read.

Both the literal path's folders and those of its real path (symbolic links resolved) are
checked. Nothing here reads ``os.environ``; the caller passes the uids it trusts.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
MAX_NODE_FILE_BYTES = 4 << 20
"""The largest discovery file read: a node of 64 servers writes about 100 KiB."""


class UntrustedNodeFile(ValueError):
    """A node file or folder another user could have written; the message says which and why."""


class SocketMissing(FileNotFoundError):
    """A socket is absent from its folder, which passed the checks: nobody else can create it there."""


def trusted_uids(extra: Iterable[int] = ()) -> frozenset[int]:
    """This process's user, root, and ``extra``."""
    return frozenset({os.geteuid(), 0, *extra})


def describe_uid(uid: int) -> str:
    """``uid 65534 (nobody)``, or the bare uid where the name is unknown (another container's)."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_owner(found: os.stat_result, trusted: frozenset[int], what: str, path: Path, why: str) -> None:
    """Refuse what a user outside ``trusted`` owns; ``why`` says what that user could then do."""
    if found.st_uid not in trusted:
        expected = ", ".join(describe_uid(uid) for uid in sorted(trusted))
        raise UntrustedNodeFile(
            f"{what} ({path}) belongs to {describe_uid(found.st_uid)}, expected one of {expected}{why}"
        )


def check_folder(
    folder: Path, trusted: frozenset[int], what: str, fix: str, owners: frozenset[int] | None = None
) -> None:
    """Refuse ``folder`` (the one holding a node file) and the folders above it unless no
    untrusted user could write them; ``what`` names the folder's role, ``fix`` how to set it
    right, both for the message. ``owners``: who may own ``folder`` itself (default: ``trusted``).
    ``FileNotFoundError`` when a folder does not exist."""
    literal = Path(os.path.abspath(folder))
    real = Path(os.path.realpath(folder))
    for path in dict.fromkeys([real, literal]):
        _check_one(path, trusted if owners is None else owners, what, fix, own=True)
        for above in path.parents:
            _check_one(above, trusted, f"{above}, a folder above {what}", fix, own=False)


def _check_one(path: Path, trusted: frozenset[int], what: str, fix: str, own: bool) -> None:
    try:
        found = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} ({path}) does not exist") from None
    except OSError as exc:
        raise UntrustedNodeFile(f"cannot check {what} ({path}): {exc}") from None
    if not stat.S_ISDIR(found.st_mode):
        raise UntrustedNodeFile(f"{what} ({path}) is not a folder")
    _check_owner(found, trusted, what, path, f": another user could put files of their own there; {fix}")
    writable = found.st_mode & GROUP_OR_OTHER_WRITE
    if writable and (own or not found.st_mode & stat.S_ISVTX):
        raise UntrustedNodeFile(
            f"{what} ({path}) has mode {stat.S_IMODE(found.st_mode):04o}: writable by "
            f"{'its group' if writable == stat.S_IWGRP else 'other users'}, who could replace the "
            f"files in it; expected no write permission for group and others "
            f"{'' if own else '(or the sticky bit) '}; {fix}"
        )


def read_node_file(path: Path, trusted: frozenset[int], what: str, fix: str) -> str:
    """The text of ``path`` after ``check_folder`` on its folder, read from a descriptor that
    is checked itself (a regular file, not a link, owned by a trusted user, writable by none of
    the others). ``FileNotFoundError`` when it, or its folder, does not exist."""
    check_folder(path.parent, trusted, f"the folder of {what}", fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if os.path.islink(path):
            raise UntrustedNodeFile(f"{what} ({path}) is a symbolic link; {fix}") from None
        raise UntrustedNodeFile(f"cannot open {what} ({path}): {exc}") from None
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(file.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise UntrustedNodeFile(f"{what} ({path}) is not a regular file")
        _check_owner(found, trusted, what, path, f"; {fix}")
        if found.st_mode & GROUP_OR_OTHER_WRITE:
            raise UntrustedNodeFile(
                f"{what} ({path}) has mode {stat.S_IMODE(found.st_mode):04o}: writable by others; "
                f"expected no write permission for group and others; {fix}"
            )
        data = file.read(MAX_NODE_FILE_BYTES + 1)
    if len(data) > MAX_NODE_FILE_BYTES:
        raise UntrustedNodeFile(f"{what} ({path}) is larger than {MAX_NODE_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def check_node_socket(path: Path, trusted: frozenset[int], what: str, fix: str) -> None:
    """Refuse a unix socket that a trusted user did not create, or whose folder another user can
    write. The socket's own mode is not judged: connecting needs write permission on it.
    ``SocketMissing`` when the socket is not there (its folder checked); ``FileNotFoundError``
    when a folder is missing."""
    check_folder(path.parent, trusted, f"the folder of {what}", fix)
    try:
        found = path.lstat()
    except FileNotFoundError:
        raise SocketMissing(f"{what} ({path}) is missing") from None
    except OSError as exc:
        raise UntrustedNodeFile(f"cannot check {what} ({path}): {exc}") from None
    if not stat.S_ISSOCK(found.st_mode):
        raise UntrustedNodeFile(f"{what} ({path}) is not a unix socket")
    _check_owner(found, trusted, what, path, f": a process of another user listens there; {fix}")
