"""A stream's payload files in the node's shared memory: one per batch in flight, reused.

Each file holds a request's Arrow IPC stream at its start and leaves the rest for the answer,
which the server writes there (``SharedMemoryRegion``). A file is busy from the moment its batch
is written until the server answered that batch, whatever the answer; then it serves the next
batch. Answers are copied out of the file before it is reused, so a result the task still holds
never changes under it.

A file's memory is reserved when it is made (``posix_fallocate``): a store through a mapping of
a tmpfs that is full is a SIGBUS that kills the process as it writes a batch, where a reservation
that fails is a plain error and the batch travels inline. (The server never maps the file: it
reads and writes it by copy, and an answer a full tmpfs cannot take comes inline.) Rooms are
therefore sized to what is expected, not generously: the input's to the batch, the answer's to
what earlier answers took per row (a quarter of the input before the first one); an answer that
does not fit comes inline, and later files are made to fit it.

A batch is written where its largest buffer (the values of a tensor column) starts on a 64-byte
boundary of the file: the server then reads the values in place and hands them to TensorFlow,
which takes only memory aligned as its own allocator's without copying it. Where that is depends
only on the batch's schema and row count, so it is found once per pair (by writing at 0 and
looking) and kept.

The server unlinks a file's name once it has opened it; ``close`` unlinks whatever it has not
seen (a stream that ends before its first answer), so no file outlives its stream.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import stat
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import decode_batch
from udfserve.shared_memory import FILE_PREFIX, FILE_SUFFIX, ipc_stream_size, write_ipc_into

logger = logging.getLogger(__name__)

MIN_ROOM_BYTES = 64 << 10
ALIGNMENT_BYTES = 64
"""The alignment TensorFlow needs to use memory without copying it."""
MAX_KNOWN_LAYOUTS = 16
SPARE_FILES = 2
"""Free files kept beyond the batches in flight, before the smallest is let go."""


@dataclass(eq=False)
class _PayloadFile:
    path: Path
    memory: mmap.mmap
    view: memoryview
    input_room: int
    output_room: int

    def region(self, start: int, size: int) -> pa.Buffer:
        """Bytes of the file, zero-copy and writable (a view's slice stays writable, a Buffer's not)."""
        return pa.py_buffer(self.view[start : start + size])

    def __post_init__(self) -> None:
        # A process that exits, or drops its pool, without closing it still unlinks the name (a
        # file the server has not mapped yet is otherwise left in the folder); only a killed
        # process cannot, in the moment between creating a file and the server mapping it.
        self._unlink = weakref.finalize(self, _unlink_quietly, self.path)

    def close(self) -> None:
        self._unlink()
        with contextlib.suppress(BufferError):  # a slice still alive: the mapping goes with it
            self.view.release()
            self.memory.close()


@dataclass
class SharedMemoryPayloads:
    """The payload files of one stream, in ``directory``; thread-safe (the task's thread writes
    batches, the reader thread takes answers)."""

    directory: Path
    max_in_flight: int
    group_access: bool = False
    """Files readable and writable by their group too (0660), for a server of another user in
    that group; else by their owner only (0600)."""
    _free: list[_PayloadFile] = field(default_factory=list)
    _busy: dict[int, _PayloadFile] = field(default_factory=dict)
    _answer_bytes_per_row: float = 0.0
    _starts: dict[tuple[pa.Schema, int], int] = field(default_factory=dict)
    """Where a batch of this schema and row count is written so its largest buffer is aligned."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False
    placing: bool = True
    """False once the server refused this memory: new batches travel inline, answers to those
    already placed are still read."""

    def __post_init__(self) -> None:
        if self.group_access:
            _warn_unless_setgid(self.directory)

    def place(self, batch_id: int, batch: pa.RecordBatch) -> tuple[pb.SharedMemoryRegion, ...] | None:
        """Write ``batch`` into a file for ``batch_id``: the input and output regions to send, or
        None when no file can be had (the folder is full or gone): send the batch inline then."""
        input_bytes = ipc_stream_size(batch) + ALIGNMENT_BYTES
        if self._answer_bytes_per_row:
            output_room = int(self._answer_bytes_per_row * batch.num_rows * 1.25) + MIN_ROOM_BYTES
        else:
            output_room = input_bytes // 4 + MIN_ROOM_BYTES
        with self._lock:
            if self._closed or not self.placing:
                return None
            payload_file = self._take(input_bytes, output_room)
        if payload_file is None:
            return None
        layout = (batch.schema, batch.num_rows)
        start = self._starts.get(layout)
        written = self._write(payload_file, start or 0, batch)
        if written is not None and start is None:
            start = _aligning_start(payload_file.region(0, written))
            if len(self._starts) >= MAX_KNOWN_LAYOUTS:
                self._starts.clear()
            self._starts[layout] = start
            if start:
                written = self._write(payload_file, start, batch)
        if written is None:  # a dictionary batch larger than its estimate
            with self._lock:
                self._retire(payload_file)
            return None
        with self._lock:
            self._busy[batch_id] = payload_file
        path = str(payload_file.path)
        return (
            pb.SharedMemoryRegion(path=path, offset=start or 0, size=written),
            pb.SharedMemoryRegion(path=path, offset=payload_file.input_room, size=payload_file.output_room),
        )

    @staticmethod
    def _write(payload_file: _PayloadFile, start: int, batch: pa.RecordBatch) -> int | None:
        return write_ipc_into(payload_file.region(start, payload_file.input_room - start), batch)

    def answer(self, batch_id: int, size: int) -> pa.RecordBatch:
        """The answer the server wrote for ``batch_id`` (``output_region_bytes`` = ``size``), copied
        out of the file, which is then free; raises ``ArrowPayloadError`` when it cannot be read."""
        with self._lock:
            payload_file = self._busy.get(batch_id)
        if payload_file is None or size > payload_file.output_room:
            self.release(batch_id)
            room = "no file" if payload_file is None else f"{payload_file.output_room} bytes of room"
            raise ValueError(
                f"the server says it wrote {size} bytes of answer to batch {batch_id} in shared memory, "
                f"where this stream has {room}"
            )
        try:
            start = payload_file.input_room
            copied = payload_file.view[start : start + size].tobytes()
        finally:
            self.release(batch_id)
        result = decode_batch(copied, "PredictResponse.output_region")
        self.learn_answer_size(result.num_rows, size)
        return result

    def release(self, batch_id: int) -> bool:
        """The server answered ``batch_id`` without writing into its file: the file is free.
        False when no file held that batch (it was sent inline)."""
        with self._lock:
            payload_file = self._busy.pop(batch_id, None)
            if payload_file is not None:
                if self._closed:
                    payload_file.close()
                else:
                    self._free.append(payload_file)
        return payload_file is not None

    def learn_answer_size(self, rows: int, size: int) -> None:
        """An answer of ``rows`` rows took ``size`` bytes: later rooms fit answers as large per row
        (one that came inline, not fitting its room, makes them bigger)."""
        if rows:
            self._answer_bytes_per_row = max(self._answer_bytes_per_row, size / rows)

    def close(self) -> None:
        """Unmap and unlink every file; busy ones too (the stream is over, their answers are not wanted)."""
        with self._lock:
            self._closed = True
            files = self._free + list(self._busy.values())
            self._free.clear()
            self._busy.clear()
        for payload_file in files:
            payload_file.close()

    def _take(self, input_bytes: int, output_room: int) -> _PayloadFile | None:
        for index, candidate in enumerate(self._free):
            if candidate.input_room >= input_bytes and candidate.output_room >= output_room:
                return self._free.pop(index)
        while self._free and len(self._free) + len(self._busy) >= self.max_in_flight + SPARE_FILES:
            self._retire(min(self._free, key=lambda f: f.input_room + f.output_room))
        return self._create(_room(input_bytes), _room(output_room))

    def _retire(self, payload_file: _PayloadFile) -> None:
        if payload_file in self._free:
            self._free.remove(payload_file)
        payload_file.close()

    def _create(self, input_room: int, output_room: int) -> _PayloadFile | None:
        path = self.directory / f"{FILE_PREFIX}{secrets.token_hex(12)}{FILE_SUFFIX}"
        size = input_room + output_room
        mode = 0o660 if self.group_access else 0o600
        try:
            descriptor = os.open(
                path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode
            )
        except OSError as exc:
            logger.warning("no shared-memory file in %s (%s); batches travel inline", self.directory, exc)
            return None
        try:
            if self.group_access:
                os.fchmod(descriptor, mode)  # the process's umask took group write away at open
            os.posix_fallocate(descriptor, 0, size)  # ENOSPC now, not SIGBUS at the first store
            memory = mmap.mmap(descriptor, size)
        except OSError as exc:
            path.unlink()
            logger.warning("no shared-memory file of %d bytes in %s (%s)", size, self.directory, exc)
            return None
        finally:
            os.close(descriptor)
        return _PayloadFile(path, memory, memoryview(memory), input_room, output_room)


_WARNED_FOLDERS: set[Path] = set()


def _warn_unless_setgid(directory: Path) -> None:
    """Files for a group go to the creator's own group unless the folder hands its own down (the
    setgid bit): then every member of that group could read the payloads. Said once per folder."""
    if directory in _WARNED_FOLDERS:
        return
    _WARNED_FOLDERS.add(directory)
    with contextlib.suppress(OSError):  # a missing folder is reported where files are made
        if not directory.stat().st_mode & stat.S_ISGID:
            logger.warning(
                "shared_memory_group_access: %s has no setgid bit, so payload files belong to this "
                "process's own group, which may read them; expected a folder of the servers' group "
                "with mode 3730 or 3770 (see docs/deployment.md, Shared memory)",
                directory,
            )


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _aligning_start(written: pa.Buffer) -> int:
    """Where to write the stream just written at the start of ``written`` (an aligned address: a
    file's mapping starts on a page) so that its largest buffer starts on an aligned address."""
    batch = pa.ipc.open_stream(written).read_next_batch()
    buffers = [b for column in batch.columns for b in column.buffers() if b is not None and b.size]
    if not buffers:
        return 0
    largest = max(buffers, key=lambda b: b.size)
    return -(largest.address - written.address) % ALIGNMENT_BYTES


def _room(needed: int) -> int:
    """Room for ``needed`` bytes and an eighth more, in whole 64 KiB: a file then serves the
    batches of a partition, which differ little in size (the last one is smaller)."""
    return -(-(needed + needed // 8) // MIN_ROOM_BYTES) * MIN_ROOM_BYTES
