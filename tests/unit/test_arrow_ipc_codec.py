"""``encode_batch`` writes exactly what pyarrow's stream writer writes; ``decode_batch`` reads each
message of a payload once, and the streams that need pyarrow's own stream reader (dictionaries)
and the malformed sequences of messages are still answered exactly.

The hostile payloads (random, truncated, forged lengths, compressed) are in ``test_hostile_input.py``.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def two_batch_stream(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def encode_schema_only(schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass  # no batch: the stream holds the schema message and the end marker only
    return sink.getvalue().to_pybytes()


def stream_writer_bytes(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    "batch",
    [
        pa.record_batch({"p": pa.FixedSizeListArray.from_arrays(pa.array([0.5] * 12, pa.float32()), 4)}),
        pa.record_batch(
            {"x": pa.array([[1, 2], None, [3]], pa.list_(pa.int64())), "y": pa.array([1.0, 2, 3])}
        ),
        pa.record_batch({"x": pa.array(range(10), pa.int32())}).slice(3, 4),
        pa.record_batch({"x": pa.array([], pa.float64())}),
        pa.record_batch({"s": pa.array([{"a": 1}, {"a": None}])}),
    ],
    ids=["fixed-size list", "list with nulls", "sliced", "empty", "struct"],
)
def test_encoding_writes_the_bytes_of_pyarrows_stream_writer(batch: pa.RecordBatch) -> None:
    assert encode_batch(batch) == stream_writer_bytes(batch)


def test_a_batch_decodes_to_the_batch_that_was_encoded() -> None:
    batch = pa.record_batch({"features": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32()))})
    assert decode_batch(encode_batch(batch)).equals(batch)


def test_a_repeated_schema_decodes_every_payload_to_its_own_values() -> None:
    first = pa.record_batch({"x": pa.array([1.0, 2.0], pa.float32())})
    second = pa.record_batch({"x": pa.array([5.0], pa.float32())})
    assert decode_batch(encode_batch(first)).equals(first)
    assert decode_batch(encode_batch(second)).equals(second)


def test_a_dictionary_column_is_encoded_and_decoded_with_its_dictionary() -> None:
    indices = pa.array([0, 1, 0], pa.int8())
    batch = pa.record_batch(
        {"label": pa.DictionaryArray.from_arrays(indices, pa.array(["a", "b"])), "x": pa.array([1, 2, 3])}
    )
    assert decode_batch(encode_batch(batch)).equals(batch)


def test_two_record_batches_are_refused_naming_how_many() -> None:
    batch = pa.record_batch({"x": pa.array([1.0, 2.0])})
    with pytest.raises(ArrowPayloadError, match="holds 2 record batches; expected exactly one per message"):
        decode_batch(two_batch_stream(batch))


def test_a_second_schema_message_is_refused() -> None:
    payload = encode_batch(pa.record_batch({"x": pa.array([1.0])}))
    restarted = payload[: -len(END_OF_STREAM)] + payload
    with pytest.raises(
        ArrowPayloadError, match="expected record batch messages after the schema, received a schema message"
    ):
        decode_batch(restarted)


def test_an_end_marker_alone_is_refused_naming_the_missing_schema() -> None:
    with pytest.raises(
        ArrowPayloadError, match="expected a schema message first, received the end of the stream"
    ):
        decode_batch(END_OF_STREAM)


def test_a_batch_without_its_schema_is_refused() -> None:
    payload = encode_batch(pa.record_batch({"x": pa.array([1.0])}))
    schema_only = encode_schema_only(pa.schema([pa.field("x", pa.float64())]))
    batch_first = payload[len(schema_only) - len(END_OF_STREAM) :]
    with pytest.raises(ArrowPayloadError, match="expected a schema message first, received a record batch"):
        decode_batch(batch_first)
