"""The shared-memory files one Predict stream names: checked, mapped once, read and written in place.

Only a client on this node can name a file here: the stream must come through the unix socket
(whose file mode already limits who connects), the file must lie directly in the configured
folder under a ``udfserve-*.shm`` name, be a regular file (no symbolic link followed) and belong
to this server's user, or to one of the users the server was told to trust
(``--shared-memory-uids``: executors that run as another user, which then create their files
for their group, the server's, to read and write). Once mapped, its name is unlinked: the
mappings of both sides keep the memory alive, and nothing is left in the folder when either side
dies. Mappings are dropped with the stream; batches still reading from one keep it alive until
they are gone. The file's descriptor stays open with its mapping (at most ``MAX_FILES_PER_STREAM``
per stream), so that every use checks the file still holds the range it names.

A file the server cannot use is refused with ``SharedMemoryRefused`` before any row is computed,
so the client resends the same batch inline and nothing is lost or answered twice.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
from pathlib import Path
from typing import Protocol

import grpc
import pyarrow as pa

from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.shared_memory import FILE_NAME_PATTERN

logger = logging.getLogger(__name__)

MAX_FILES_PER_STREAM = 256
"""Files one stream may map; a client replaces a file only when its batches outgrow it."""


class Region(Protocol):
    """``SharedMemoryRegion`` of the wire contract."""

    path: str
    offset: int
    size: int


class SharedMemoryRefused(ServingError):
    """The server cannot use the named shared memory; the batch is served if sent inline."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class StreamRegions:
    """The files of one stream, by the path the client named."""

    def __init__(
        self, directory: Path | None, refusal: str = "", other_uids: frozenset[int] = frozenset()
    ) -> None:
        """``directory``: the shared-memory folder, None when this stream may not use one;
        ``refusal`` then says why. ``other_uids``: users besides this server's whose files it maps."""
        self._directory = directory
        self._refusal = refusal
        self._other_uids = other_uids
        self._maps: dict[str, tuple[int, memoryview]] = {}
        """By the client's path: the file's descriptor, kept to see its size, and its mapping."""

    def close(self) -> None:
        for descriptor, _ in self._maps.values():
            os.close(descriptor)
        self._maps.clear()

    def bytes_of(self, region: Region, field: str) -> pa.Buffer:
        """The bytes of ``region``, zero-copy and writable: they are the client's file. ``field``
        names the request's field in errors."""
        entry = self._maps.get(region.path)
        if entry is None:
            entry = self._map(region.path, field)
        descriptor, mapped = entry
        end = region.offset + region.size
        if end > len(mapped):
            raise InvalidInput(
                f"{field} names bytes {region.offset}..{end} of {region.path}, a file of {len(mapped)} "
                "bytes; expected a range inside the file"
            )
        # A page of the mapping past the file's end faults (SIGBUS) and would kill the server: a
        # file its client shrank since it was mapped is refused. (One shrunk while the server
        # reads it still faults; see docs/deployment.md.)
        size = os.fstat(descriptor).st_size
        if end > size:
            raise InvalidInput(
                f"{field} names bytes {region.offset}..{end} of {region.path}, which shrank to {size} "
                f"bytes after this stream mapped its {len(mapped)}; expected the file to keep its size "
                "while the stream uses it"
            )
        return pa.py_buffer(mapped[region.offset : end])  # a view's slice stays writable, a Buffer's not

    def _map(self, path_text: str, field: str) -> tuple[int, memoryview]:
        if self._directory is None:
            raise SharedMemoryRefused(f"{field}: {self._refusal}; send the batch in arrow_ipc")
        path = Path(path_text)
        if (
            not path.is_absolute()
            or not FILE_NAME_PATTERN.match(path.name)
            or path.parent.resolve() != self._directory
        ):
            raise SharedMemoryRefused(
                f"{field} names {path_text!r}; expected a file udfserve-<8-64 letters, digits, _ or ->.shm "
                f"directly in this server's shared-memory folder {self._directory}"
            )
        if len(self._maps) >= MAX_FILES_PER_STREAM:
            raise InvalidInput(
                f"{field} names a {MAX_FILES_PER_STREAM + 1}th shared-memory file on one stream; "
                f"expected at most {MAX_FILES_PER_STREAM} (reuse files across batches)"
            )
        # The entry of our folder, not the client's spelling of it: a parent the client swaps for
        # a symbolic link after the check above leads nowhere else.
        path = self._directory / path.name
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except PermissionError as exc:
            raise SharedMemoryRefused(
                f"{field}: cannot open {path} ({exc.strerror}): a file of another user must give this "
                "server's group read and write (ClientConfig.shared_memory_group_access, in a folder "
                "whose group is the server's) and its owner be in --shared-memory-uids"
            ) from None
        except OSError as exc:
            raise SharedMemoryRefused(
                f"{field}: cannot open {path} ({exc.strerror}): the client and this server must see the "
                "same shared-memory folder (same node, same tmpfs mounted at the same path)"
            ) from None
        try:
            info = os.fstat(descriptor)
            trusted = info.st_uid == os.geteuid() or info.st_uid in self._other_uids
            if not stat.S_ISREG(info.st_mode) or not trusted:
                others = f" or of --shared-memory-uids {sorted(self._other_uids)}" if self._other_uids else ""
                raise SharedMemoryRefused(
                    f"{field}: {path} is not a regular file of this server's user (uid {os.geteuid()})"
                    f"{others}; received mode {stat.filemode(info.st_mode)}, uid {info.st_uid}"
                )
            if info.st_size == 0:
                raise InvalidInput(f"{field}: {path} is empty; expected the client's written file")
            mapped = mmap.mmap(descriptor, info.st_size)
        except BaseException:
            os.close(descriptor)
            raise
        # Both mappings keep the memory; the name must not outlive the stream. The client may have
        # closed the file already: our mapping still holds the bytes. A sticky folder that is not
        # ours keeps another user's file from us: its client removes the name when it is done.
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(path)
        entry = descriptor, memoryview(mapped)
        self._maps[path_text] = entry
        logger.debug("mapped shared-memory file %s (%d bytes)", path, info.st_size)
        return entry
