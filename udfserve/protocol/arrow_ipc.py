"""One Arrow record batch in, one IPC stream out, and back.

Both sides use these two functions so that the payload of a request or a response is
always exactly one record batch. Decoding is zero-copy: the returned batch points into
the message bytes, which therefore must stay alive as long as the batch.
"""

from __future__ import annotations

import pyarrow as pa


class ArrowPayloadError(ValueError):
    """The bytes are not one well-formed Arrow record batch."""


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """Serialise ``batch`` as an Arrow IPC stream (schema message, one batch, end marker)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(payload: bytes, what: str = "arrow_ipc") -> pa.RecordBatch:
    """Read the single record batch of an IPC stream; ``what`` names the field in errors."""
    if not payload:
        raise ArrowPayloadError(f"{what} is empty; expected an Arrow IPC stream holding one record batch")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        raise ArrowPayloadError(
            f"{what} is not a valid Arrow IPC stream ({len(payload)} bytes): {exc}"
        ) from exc
    if len(batches) == 0:
        # A stream with a schema and no batch is how an empty batch travels when a writer
        # skipped it; treat it as zero rows of that schema.
        return pa.RecordBatch.from_pylist([], schema=reader.schema)
    if len(batches) > 1:
        raise ArrowPayloadError(
            f"{what} holds {len(batches)} record batches; expected exactly one per message"
        )
    batch = batches[0]
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ArrowPayloadError(f"{what} holds a malformed record batch: {exc}") from exc
    return batch
