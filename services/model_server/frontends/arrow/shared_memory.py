"""The shared-memory files one Predict stream names: checked, opened once, read and written by copy.

Only a client on this node can name a file here: the stream must come through the unix socket
(whose file mode already limits who connects), the file must lie directly in the configured
folder under a ``udfserve-*.shm`` name, be a regular file (no symbolic link followed) and belong
to this server's user, or to one of the users the server was told to trust
(``--shared-memory-uids``: executors that run as another user, which then create their files
for their group, the server's, to read and write). Once opened, its name is unlinked: the
descriptors of both sides keep the memory alive, and nothing is left in the folder when either
side dies. Descriptors are closed with the stream (at most ``MAX_FILES_PER_STREAM`` per stream).

The server never maps a client's file. A mapping of a file that its owner can truncate, or
whose pages sit in a full tmpfs, faults (SIGBUS, the end of the process) at the first load or
store past what the file still holds: every client of the node would lose its server to one
client's mistake or malice. Requests are therefore read with ``preadv`` into memory of the
server's own, and answers written with one ``pwritev`` straight from the answer's buffers: a file that
shrank gives a short read or a size check that fails, a full tmpfs gives ``ENOSPC``, and each is
an error of that request only. The copy also keeps a client from changing a batch after the
server checked it. It costs one copy of each request (the answer is copied once, as into a
mapping), measured in docs/benchmarks.md ("Shared memory, read by copy"), and keeps what shared
memory is for: no socket, no protobuf field, no gRPC buffer on the way.

A read keeps the file's alignment: the request's bytes land at the same offset modulo 64 in the
server's buffer as in the file, so the values the client aligned for TensorFlow stay aligned and
are still handed to it without a further copy.

A file the server cannot use is refused with ``SharedMemoryRefused`` before any row is computed,
so the client resends the same batch inline and nothing is lost or answered twice.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import grpc
import pyarrow as pa

from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.shared_memory import FILE_NAME_PATTERN

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

logger = logging.getLogger(__name__)

MAX_FILES_PER_STREAM = 256
"""Files one stream may open; a client replaces a file only when its batches outgrow it."""
ALIGNMENT_BYTES = 64
"""The alignment TensorFlow needs to use memory without copying it (the client aligns to it)."""
DEFAULT_MAX_REGION_BYTES = 256 << 20
"""The largest request region read (``--shared-memory-max-request-bytes``): each is copied into
the server's memory, and a sparse file may claim any size without holding it."""


class Region(Protocol):
    """``SharedMemoryRegion`` of the wire contract."""

    path: str
    offset: int
    size: int


class SharedMemoryRefused(ServingError):
    """The server cannot use the named shared memory; the batch is served if sent inline."""

    code = grpc.StatusCode.FAILED_PRECONDITION


@dataclass(frozen=True)
class _OpenFile:
    path: Path
    descriptor: int
    size: int
    """The file's size when the stream opened it: every region must lie inside it."""


class StreamRegions:
    """The files of one stream, by the path the client named."""

    def __init__(
        self,
        directory: Path | None,
        refusal: str = "",
        other_uids: frozenset[int] = frozenset(),
        max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
    ) -> None:
        """``directory``: the shared-memory folder, None when this stream may not use one;
        ``refusal`` then says why. ``other_uids``: users besides this server's whose files it
        reads. ``max_region_bytes``: the largest request region the server copies."""
        self._directory = directory
        self._refusal = refusal
        self._other_uids = other_uids
        self._max_region_bytes = max_region_bytes
        self._files: dict[str, _OpenFile] = {}
        self._warned_write = False

    def close(self) -> None:
        for opened in self._files.values():
            os.close(opened.descriptor)
        self._files.clear()

    def read(self, region: Region, field: str) -> pa.Buffer:
        """A copy of the bytes of ``region``, writable and at the file's alignment modulo 64.
        ``field`` names the request's field in errors. A file that no longer holds the region
        (its client shrank it) is ``InvalidInput`` naming the region and the size found."""
        opened = self._opened(region, field)
        if region.size > self._max_region_bytes:
            raise InvalidInput(
                f"{field} names {region.size} bytes of {opened.path}; expected at most "
                f"{self._max_region_bytes} (the server's --shared-memory-max-request-bytes); send fewer rows "
                "per request"
            )
        lead = region.offset % ALIGNMENT_BYTES
        view = memoryview(pa.allocate_buffer(lead + region.size))  # 64-byte aligned, as the file
        try:
            got = _read_into(opened.descriptor, view, region.offset - lead)
        except OSError as exc:
            raise SharedMemoryRefused(
                f"{field}: cannot read {opened.path} ({exc.strerror}); send the batch in arrow_ipc"
            ) from None
        if got < len(view):
            raise self._shrunk(opened, region, field)
        return pa.py_buffer(view[lead:])  # a view's slice stays writable, a Buffer's not

    def write(self, region: Region, field: str, batch: pa.RecordBatch) -> int | None:
        """Write ``batch`` as an Arrow IPC stream at the start of ``region``: the bytes written,
        or None when it does not fit there or the file cannot take it (a full tmpfs): the answer
        then goes inline. A file that shrank below the region is ``InvalidInput``."""
        opened = self._opened(region, field)
        pieces = _Pieces()
        with pa.ipc.new_stream(pa.PythonFile(pieces, mode="w"), batch.schema) as writer:
            writer.write_batch(batch)
        if pieces.size > region.size:
            return None
        if os.fstat(opened.descriptor).st_size < region.offset + pieces.size:
            raise self._shrunk(opened, region, field)
        try:
            _write_all(opened.descriptor, pieces.views, region.offset)
        except OSError as exc:
            if not self._warned_write:  # once per stream: the client decides how often this happens
                self._warned_write = True
                logger.warning(
                    "cannot write an answer into the shared-memory file %s (%s); this stream's answers "
                    "that cannot be written there come inline",
                    opened.path,
                    exc.strerror,
                )
            return None
        return pieces.size

    def _shrunk(self, opened: _OpenFile, region: Region, field: str) -> InvalidInput:
        size = os.fstat(opened.descriptor).st_size
        return InvalidInput(
            f"{field} names bytes {region.offset}..{region.offset + region.size} of {opened.path}, which "
            f"holds {size} bytes now, {opened.size} when this stream opened it; expected the file to "
            "keep its size while the stream uses it"
        )

    def _opened(self, region: Region, field: str) -> _OpenFile:
        """The file ``region`` names, opened once per stream, the region checked against its size."""
        opened = self._files.get(region.path)
        if opened is None:
            opened = self._open(region.path, field)
        end = region.offset + region.size
        if end > opened.size:
            raise InvalidInput(
                f"{field} names bytes {region.offset}..{end} of {region.path}, a file of {opened.size} "
                "bytes; expected a range inside the file"
            )
        return opened

    def _open(self, path_text: str, field: str) -> _OpenFile:
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
        if len(self._files) >= MAX_FILES_PER_STREAM:
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
        except BaseException:
            os.close(descriptor)
            raise
        # Both descriptors keep the memory; the name must not outlive the stream. The client may
        # have closed the file already: our descriptor still holds the bytes. A sticky folder that
        # is not ours keeps another user's file from us: its client removes the name when done.
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(path)
        opened = _OpenFile(path, descriptor, info.st_size)
        self._files[path_text] = opened
        logger.debug("opened shared-memory file %s (%d bytes)", path, info.st_size)
        return opened


def _read_into(descriptor: int, view: memoryview, offset: int) -> int:
    """Read into all of ``view`` from ``offset`` of the file; the bytes read, fewer at its end."""
    done = 0
    while done < len(view):
        got = os.preadv(descriptor, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
"""The most buffers one ``pwritev`` takes."""


class _Pieces(io.RawIOBase):
    """The pieces of an IPC stream as Arrow writes them, kept, not copied: the answer's own
    buffers, and the small messages and padding Arrow hands over as bytes. Written to the file
    in one ``pwritev`` once the stream is complete and its size checked against the region."""

    def __init__(self) -> None:
        super().__init__()
        self.views: list[memoryview] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        self.views.append(view)
        self.size += len(view)
        return len(view)


def _write_all(descriptor: int, views: list[memoryview], offset: int) -> None:
    """Write ``views`` one after the other at ``offset`` of the file, with as few ``pwritev`` as
    they take (a call may write less than asked, or take at most ``IOV_MAX`` buffers). Raises
    ``OSError`` (``ENOSPC`` when the tmpfs is full)."""
    pending = [view for view in views if len(view)]
    while pending:
        written = os.pwritev(descriptor, pending[:IOV_MAX], offset)
        offset += written
        while pending and written >= len(pending[0]):
            written -= len(pending.pop(0))
        if written:
            pending[0] = pending[0][written:]
