"""Binding the server's unix socket so that it is never reachable with wider permissions than its mode.

A socket file is created by ``bind`` with the mode ``0777`` less the process's umask, and gRPC
binds it itself; a ``chmod`` afterwards leaves a moment in which, under a permissive umask (000),
any local user could connect. Changing the umask around the bind is no fix: it is process-wide,
and other threads (TensorFlow's, gRPC's) may create files meanwhile. Instead the socket is bound
inside a new folder of mode 0700, which only the server's user can enter whatever the socket's
own mode, given its final mode there, then renamed to its path: it appears there with that mode
already, and the rename keeps the listening socket (connections follow the file's inode).

``listen_on_unix_socket`` is how the server opens each of its sockets (``--socket``, and
``--kserve-socket`` of the native KServe front end): the same folder, stale-file and mode rules.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

PRIVATE_FOLDER_MODE = 0o700
BIND_NAME = "s"
"""The socket's name inside the private folder: short, since a unix socket path has a limit of
about 100 bytes and the private folder adds a level."""
_FOLDER_ATTEMPTS = 100


def listen_on_unix_socket(path: Path, mode: int, bind: Callable[[str], object], flag: str) -> None:
    """Listen on the unix socket ``path`` (the server's ``flag``) with the permissions ``mode``,
    through ``bind`` as in ``bind_private_unix_socket``: its folder is made if missing, and a
    stale socket of a previous run there is removed first.

    Raises ``OSError`` when another process still listens on ``path`` (a server still running: two
    servers must never take each other's socket), or when ``bind_private_unix_socket`` does.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        if socket_answers(path):
            raise OSError(
                f"cannot listen on unix socket {path}: another process is listening on it "
                f"(a server still running); stop it, or give this server another {flag}"
            )
        path.unlink()  # a stale socket of a previous run of this server
    bind_private_unix_socket(path, mode, bind)


def socket_answers(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` (a stale one refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def bind_private_unix_socket(path: Path, mode: int, bind: Callable[[str], object]) -> None:
    """Bind the unix socket ``path`` with the permissions ``mode`` through ``bind``, which takes a
    gRPC target (``unix:<path>``) and binds a listener there.

    Raises ``OSError`` when ``path`` holds something other than a socket (never replaced), or when
    the private folder cannot be made next to it.
    """
    if path.exists() and not path.is_socket():
        raise OSError(
            f"cannot listen on unix socket {path}: a {_kind(path)} is there; expected a free path or a "
            "stale socket"
        )
    folder = _private_folder(path.parent)
    bound = folder / BIND_NAME
    try:
        try:
            bind(f"unix:{bound}")
        except OSError as exc:
            raise OSError(
                f"cannot listen on unix socket {path}: {exc} (bound in the private folder {folder} "
                "first, then renamed into place)"
            ) from exc
        os.chmod(bound, mode)
        os.replace(bound, path)
    finally:
        try:
            bound.unlink(missing_ok=True)  # there only when binding failed half-way
            folder.rmdir()
        except OSError as exc:
            logger.warning("cannot remove %s after binding the unix socket %s: %s", folder, path, exc)


def _private_folder(parent: Path) -> Path:
    """A new folder in ``parent`` that only this user can enter (mode 0700, whatever the umask)."""
    for _ in range(_FOLDER_ATTEMPTS):
        folder = parent / f".{secrets.token_hex(2)}"
        try:
            os.mkdir(folder, PRIVATE_FOLDER_MODE)  # the umask can only take bits away
        except FileExistsError:
            continue
        os.chmod(folder, PRIVATE_FOLDER_MODE)  # and a umask taking the owner's bits away is undone
        return folder
    raise OSError(f"cannot make a private folder in {parent} to bind the unix socket in")


def _kind(path: Path) -> str:
    mode = path.lstat().st_mode
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file that is not a socket"
