"""What both sides agree on about shared-memory payloads: file names, and writing a batch in place.

A client on the server's node may put a request's Arrow IPC stream in a file of a shared-memory
folder (a tmpfs) and send only where it lies (``SharedMemoryRegion``); the server writes the
answer into a second range the client named. The payload then crosses no socket and no protobuf
field: the client writes it once, the server copies it into its own memory (never mapping the
client's file, which the client could truncate under it), and the answer comes back the same
way, instead of the eight or nine copies a payload inside a gRPC message costs in Python.
"""

from __future__ import annotations

import re

import pyarrow as pa

FILE_PREFIX = "udfserve-"
FILE_SUFFIX = ".shm"
FILE_NAME_PATTERN = re.compile(r"^udfserve-[A-Za-z0-9_-]{8,64}\.shm$")
"""The only names a server opens or unlinks: never another program's file in the folder."""

DEFAULT_DIRECTORY = "/dev/shm"


def ipc_stream_size(batch: pa.RecordBatch) -> int:
    """The exact size of ``batch`` written as an IPC stream (schema, batch, end marker), found
    without writing the data."""
    return len(batch.schema.serialize()) + pa.ipc.get_record_batch_size(batch) + 8


def write_ipc_into(buffer: pa.Buffer, batch: pa.RecordBatch) -> int | None:
    """Write ``batch`` as an Arrow IPC stream at the start of the mutable ``buffer``; the bytes
    written, or None when it does not fit (nothing beyond ``buffer`` is touched either way)."""
    if ipc_stream_size(batch) > buffer.size:
        return None
    sink = pa.FixedSizeBufferWriter(buffer)
    try:
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
    except (pa.ArrowInvalid, OSError):  # a dictionary batch beyond the estimate: not enough room
        return None
    return sink.tell()
