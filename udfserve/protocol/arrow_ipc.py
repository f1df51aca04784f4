"""One Arrow record batch in, one IPC stream out, and back.

Both sides use these two functions so that the payload of a request or a response is
always exactly one record batch. Decoding is zero-copy: the returned batch points into
the message bytes, which therefore must stay alive as long as the batch.

Decoding treats the bytes as hostile: any failure of pyarrow to read them (including the
allocation failures a forged length provokes) is an ``ArrowPayloadError``, never another
exception. Compressed bodies are refused before pyarrow reads them: a compressed buffer
declares its own uncompressed size in 8 bytes, so a few bytes could make the reader allocate
and fill gigabytes (a decompression bomb), and our encoder never compresses. A batch may not
declare more rows than its payload has bits: rows of lists of length zero take no bytes, and
a few hundred bytes could otherwise declare 2**62 rows for the receiver to cut into chunks.

Decoding sits on every request's path, so the payload is read once: its messages are read and
checked one by one and the batch is built from the message already read; a schema checked once
is kept by its bytes, since a client repeats one schema in every request.
"""

from __future__ import annotations

import struct

import pyarrow as pa

# Arrow's Message flatbuffer (format/Message.fbs): field slots of the tables read below.
_MESSAGE_HEADER_TYPE_SLOT = 1  # the union ``header`` takes two slots: its type, then its offset
_MESSAGE_HEADER_SLOT = 2
_SCHEMA = 1  # MessageHeader union members
_DICTIONARY_BATCH = 2
_RECORD_BATCH = 3
_DICTIONARY_BATCH_DATA_SLOT = 1  # DictionaryBatch.data: RecordBatch
_RECORD_BATCH_COMPRESSION_SLOT = 3  # RecordBatch.compression: BodyCompression, absent when uncompressed
_SCHEMA_ENDIANNESS_SLOT = 0  # Schema.endianness: a short, Little (0) when absent
_LITTLE_ENDIAN = 0
_KNOWN_SCHEMAS: dict[bytes, tuple[pa.Schema, bool]] = {}
_KNOWN_SCHEMAS_MAX = 64
_KNOWN_SCHEMA_MAX_BYTES = 1 << 16
_PLAIN_SCHEMAS: dict[bytes, bool] = {}  # schema message -> whether it holds no dictionary
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Arrow types pyarrow has no array class for (it reads month_day_nano_interval only), by Arrow's
# own names for them; pyarrow has no predicate for them.
_UNREADABLE_TYPES = frozenset({"month_interval", "day_time_interval"})


class ArrowPayloadError(ValueError):
    """The bytes are not one well-formed Arrow record batch."""


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """Serialise ``batch`` as an Arrow IPC stream (schema message, one batch, end marker).

    The three parts are joined directly, the bytes pyarrow's stream writer writes, at half its
    cost for small batches; a schema holding dictionaries, whose dictionary batches come between
    the schema and the batch, goes through the stream writer."""
    schema = batch.schema
    schema_message = schema.serialize()
    key = schema_message.to_pybytes()
    plain = _PLAIN_SCHEMAS.get(key)
    if plain is None:
        plain = not _holds_dictionaries(schema)
        if len(_PLAIN_SCHEMAS) >= _KNOWN_SCHEMAS_MAX:
            _PLAIN_SCHEMAS.clear()
        _PLAIN_SCHEMAS[key] = plain
    if plain:
        return b"".join((key, batch.serialize(), _END_OF_STREAM))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _holds_dictionaries(schema: pa.Schema) -> bool:
    pending = [field.type for field in schema]
    while pending:
        field_type = pending.pop()
        if isinstance(field_type, pa.DictionaryType):
            return True
        pending.extend(field_type.field(index).type for index in range(field_type.num_fields))
    return False


def decode_batch(payload: bytes, what: str = "arrow_ipc") -> pa.RecordBatch:
    """Read the single record batch of an IPC stream; ``what`` names the field in errors."""
    if not payload:
        raise ArrowPayloadError(f"{what} is empty; expected an Arrow IPC stream holding one record batch")
    buffer = pa.py_buffer(payload)
    try:
        schema, count, batch = _read_stream(buffer, what)
    except ArrowPayloadError:
        raise
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise ArrowPayloadError(
            f"{what} is not a valid Arrow IPC stream ({len(payload)} bytes): {exc}"
        ) from exc
    if count == 0:
        # A stream with a schema and no batch is how an empty batch travels when a writer
        # skipped it; treat it as zero rows of that schema.
        try:
            return pa.RecordBatch.from_pylist([], schema=schema)
        except pa.ArrowException as exc:  # pyarrow cannot build empty columns of some types (unions)
            raise ArrowPayloadError(
                f"{what} holds a schema and no record batch, and no empty batch of that schema can be "
                f"made: {exc}; send one record batch"
            ) from exc
    if batch is None:
        raise ArrowPayloadError(f"{what} holds {count} record batches; expected exactly one per message")
    if batch.num_rows > 8 * len(payload):
        # Arrow lets rows take no bytes at all (null columns, lists of length zero): bounded by the
        # payload's bits, a row count is never more than the message size allows any real data.
        raise ArrowPayloadError(
            f"{what} declares {batch.num_rows} rows in {len(payload)} bytes; expected at most "
            f"{8 * len(payload)} (one bit per row)"
        )
    try:
        batch.validate(full=True)
    except pa.ArrowException as exc:
        raise ArrowPayloadError(f"{what} holds a malformed record batch: {exc}") from exc
    return batch


def _read_stream(buffer: pa.Buffer, what: str) -> tuple[pa.Schema, int, pa.RecordBatch | None]:
    """The stream's schema, the number of record batches it holds, and the batch when it holds
    exactly one. Each message is read once: the batch is built from the message already read and
    checked, unless the stream needs pyarrow's stream reader (dictionaries, big-endian data).
    Every record or dictionary batch is checked for a compressed body before anything reads it."""
    source = pa.BufferReader(buffer)
    first = _next_message(source)
    if first is None or first.type != "schema":
        received = "the end of the stream" if first is None else f"a {first.type} message"
        raise ArrowPayloadError(
            f"{what} is not a valid Arrow IPC stream ({buffer.size} bytes): expected a schema message "
            f"first, received {received}"
        )
    schema, needs_stream_reader = _schema_of(first, what)
    batch_messages: list[pa.Message] = []
    while (message := _next_message(source)) is not None:
        kind = message.type
        if kind not in ("record batch", "dictionary"):
            raise ArrowPayloadError(
                f"{what} is not a valid Arrow IPC stream ({buffer.size} bytes): expected record batch "
                f"messages after the schema, received a {kind} message"
            )
        _refuse_compressed_body(message, what)
        if kind == "dictionary":
            needs_stream_reader = True  # pyarrow reads dictionary batches only through its readers
        else:
            batch_messages.append(message)
    if needs_stream_reader:
        batches = list(pa.ipc.open_stream(buffer))
        return schema, len(batches), batches[0] if len(batches) == 1 else None
    if len(batch_messages) != 1:
        return schema, len(batch_messages), None
    return schema, 1, pa.ipc.read_record_batch(batch_messages[0], schema)


def _next_message(source: pa.BufferReader) -> pa.Message | None:
    """The next message of the stream; None at its end (the end marker, or no bytes left)."""
    try:
        return pa.ipc.read_message(source)
    except EOFError:
        return None


def _schema_of(message: pa.Message, what: str) -> tuple[pa.Schema, bool]:
    """The checked schema of a schema message, and whether its data must go through pyarrow's
    stream reader (it is big-endian: only that reader swaps it to the native order). Requests of
    one client repeat one schema, so checked schemas are kept by their metadata bytes."""
    key = message.metadata.to_pybytes()
    known = _KNOWN_SCHEMAS.get(key)
    if known is not None:
        return known
    schema = pa.ipc.read_schema(message)
    _check_fields(schema, what)
    try:
        big_endian = _declares_big_endian(key)
    except (struct.error, IndexError) as exc:
        raise ArrowPayloadError(f"{what} holds a malformed schema message: {exc}") from exc
    checked = (schema, big_endian)
    if len(key) <= _KNOWN_SCHEMA_MAX_BYTES:
        if len(_KNOWN_SCHEMAS) >= _KNOWN_SCHEMAS_MAX:
            _KNOWN_SCHEMAS.clear()  # bounded against a client sending a new schema every time
        _KNOWN_SCHEMAS[key] = checked
    return checked


def _check_fields(schema: pa.Schema, what: str) -> None:
    """Make the failures pyarrow would raise far from here, when a column is first touched, raise
    here. Arrow does not check that field names are UTF-8, and pyarrow decodes them strictly
    wherever they are read; pyarrow has no array class for some types Arrow can carry (intervals
    in months, or in days and milliseconds) and raises ``KeyError`` when it meets one. Every field
    is visited, nested ones included (the reader bounds the nesting)."""
    pending = list(schema)
    while pending:
        field = pending.pop()
        field.name  # noqa: B018 (decoding is the check)
        field_type = field.type
        # Not probed by building an empty array: pyarrow crashes on some forged types (a union
        # without children); the interval types are the only ones it has no array class for.
        if str(field_type) in _UNREADABLE_TYPES:
            raise ArrowPayloadError(
                f"{what} holds column or field {field.name!r} of type {field_type}, which cannot be read here"
            )
        if isinstance(field_type, pa.DictionaryType):
            field_type = field_type.value_type
        pending.extend(field_type.field(index) for index in range(field_type.num_fields))


def _refuse_compressed_body(message: pa.Message, what: str) -> None:
    """Refuse a record or dictionary batch message that declares a compressed body (pyarrow has
    verified its metadata flatbuffer when it read the message)."""
    try:
        codec_declared = _declares_compression(memoryview(message.metadata))
    except (struct.error, IndexError) as exc:
        raise ArrowPayloadError(f"{what} holds a malformed {message.type} message: {exc}") from exc
    if codec_declared:
        raise ArrowPayloadError(
            f"{what} holds a compressed {message.type}; expected an uncompressed Arrow IPC stream "
            "(compressed bodies are not accepted: encode with the default IpcWriteOptions)"
        )


def _declares_big_endian(metadata: bytes) -> bool:
    """Whether a Message flatbuffer holding a Schema declares big-endian data."""
    root = struct.unpack_from("<I", metadata, 0)[0]
    type_at = _field_position(metadata, root, _MESSAGE_HEADER_TYPE_SLOT)
    header_at = _field_position(metadata, root, _MESSAGE_HEADER_SLOT)
    if type_at is None or metadata[type_at] != _SCHEMA or header_at is None:
        return False
    endianness_at = _field_position(metadata, _table_at(metadata, header_at), _SCHEMA_ENDIANNESS_SLOT)
    return (
        endianness_at is not None and struct.unpack_from("<h", metadata, endianness_at)[0] != _LITTLE_ENDIAN
    )


def _declares_compression(metadata: bytes | memoryview) -> bool:
    """Whether a Message flatbuffer holding a RecordBatch or DictionaryBatch sets ``compression``."""
    root = struct.unpack_from("<I", metadata, 0)[0]
    type_at = _field_position(metadata, root, _MESSAGE_HEADER_TYPE_SLOT)
    header_type = metadata[type_at] if type_at is not None else 0
    header_at = _field_position(metadata, root, _MESSAGE_HEADER_SLOT)
    if header_type not in (_DICTIONARY_BATCH, _RECORD_BATCH) or header_at is None:
        return False
    table = _table_at(metadata, header_at)
    if header_type == _DICTIONARY_BATCH:
        data_at = _field_position(metadata, table, _DICTIONARY_BATCH_DATA_SLOT)
        if data_at is None:
            return False
        table = _table_at(metadata, data_at)
    return _field_position(metadata, table, _RECORD_BATCH_COMPRESSION_SLOT) is not None


def _field_position(metadata: bytes | memoryview, table: int, slot: int) -> int | None:
    """Where field ``slot`` of the flatbuffer table at ``table`` is stored; None when absent."""
    vtable = table - struct.unpack_from("<i", metadata, table)[0]
    vtable_bytes = struct.unpack_from("<H", metadata, vtable)[0]
    entry = 4 + 2 * slot
    if entry + 2 > vtable_bytes:
        return None
    offset = struct.unpack_from("<H", metadata, vtable + entry)[0]
    return table + offset if offset else None


def _table_at(metadata: bytes | memoryview, position: int) -> int:
    """The table an offset field at ``position`` points to."""
    return position + struct.unpack_from("<I", metadata, position)[0]
