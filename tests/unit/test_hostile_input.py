"""Hostile request payloads on the decoding path: the only exceptions are ``ArrowPayloadError`` (the
bytes are not one well-formed batch) and ``InvalidInput`` (the batch does not fit the model), which
the server answers INVALID_ARGUMENT; anything else would reach the client as INTERNAL. Nothing
hangs (hypothesis deadline) and nothing claims more rows than its bytes can carry.

Payloads: random Arrow schemas and values (nested lists, fixed-size lists of any size including
zero, structs, maps, strings and huge strings, dictionaries, nulls), random bytes, valid payloads
truncated, bit-flipped, or with absurd lengths written over their IPC metadata and buffer headers,
compressed bodies and decompression bombs.
"""

from __future__ import annotations

import struct
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch
from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.tensor_conversion import batch_to_inputs
from udfserve.runtime.tensor_spec import TensorSpec

# The inputs of the example models, and the shapes the rules treat specially (free dimensions,
# scalars, narrow integers, booleans).
MODELS: dict[str, tuple[TensorSpec, ...]] = {
    "vector": (TensorSpec(name="features", dtype="float32", shape=(64,)),),
    "matrix": (TensorSpec(name="lines", dtype="float32", shape=(16, 32)),),
    "mixed": (
        TensorSpec(name="numeric", dtype="float32", shape=(8,)),
        TensorSpec(name="category", dtype="int32", shape=()),
    ),
    "free": (TensorSpec(name="tokens", dtype="int64", shape=(-1,)),),
    "free_matrix": (TensorSpec(name="frames", dtype="float16", shape=(-1, 4)),),
    "narrow": (TensorSpec(name="pixels", dtype="uint8", shape=(3,)), TensorSpec(name="flag", dtype="bool")),
}
COLUMN_NAMES = ("features", "lines", "numeric", "category", "tokens", "frames", "pixels", "flag", "x", "")
ABSURD_LENGTHS = (-1, -(1 << 31), (1 << 31) - 1, 1 << 32, (1 << 62), (1 << 63) - 1)
HOSTILE = settings(
    max_examples=200,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode_for_model(payload: bytes, model: str) -> dict[str, np.ndarray] | None:
    """The server's decoding path; ``None`` when it refuses the payload as it must."""
    try:
        batch = decode_batch(payload)
        inputs = batch_to_inputs(batch, model, MODELS[model])
    except (ArrowPayloadError, InvalidInput):
        return None
    rows = batch.num_rows
    assert rows <= 8 * len(payload), "more rows than the payload has bits"
    for spec in MODELS[model]:
        array = inputs[spec.name]
        assert array.dtype == np.dtype(spec.dtype), (spec, array.dtype)
        assert array.shape[0] == rows and len(array.shape) == len(spec.shape) + 1, (spec, array.shape)
        assert all(want in (-1, got) for want, got in zip(spec.shape, array.shape[1:], strict=True))
    return inputs


# -- random Arrow values -----------------------------------------------------------------------------

PRIMITIVES = (
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
    pa.bool_(),
)


@st.composite
def primitive_arrays(draw: st.DrawFn, length: int) -> pa.Array:
    arrow_type = draw(st.sampled_from(PRIMITIVES))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = arrow_type.to_pandas_dtype()
    if arrow_type == pa.bool_():
        values = rng.integers(0, 2, size=length).astype(bool)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=length, dtype=dtype, endpoint=True)
    else:
        doubles = draw(
            st.sampled_from(
                [
                    rng.normal(size=length),
                    np.full(length, np.nan),
                    np.full(length, np.inf),
                    np.full(length, 1e300),
                    np.full(length, -0.0),
                ]
            )
        )
        with np.errstate(over="ignore"):  # 1e300 becomes inf in the narrower types, on purpose
            values = doubles.astype(dtype)
    mask = None
    if length and draw(st.booleans()):
        mask = rng.random(length) < 0.2
    return pa.array(values, type=arrow_type, mask=mask)


@st.composite
def other_leaf_arrays(draw: st.DrawFn, length: int) -> pa.Array:
    kind = draw(
        st.sampled_from(
            ["string", "large_string", "huge_string", "binary", "null", "dictionary", "date", "union"]
        )
    )
    if kind == "union":
        codes = pa.array(np.arange(length, dtype=np.int8) % 2)
        return pa.UnionArray.from_sparse(
            codes, [pa.array(np.zeros(length)), pa.array(np.ones(length, np.int32))]
        )
    if kind == "null":
        return pa.nulls(length)
    if kind == "date":
        return pa.array(np.arange(length, dtype=np.int32), type=pa.date32())
    if kind == "dictionary":
        dictionary = pa.array([0.5, 1.5, 2.5], pa.float32())
        indices = pa.array(np.arange(length, dtype=np.int8) % 3)
        return pa.DictionaryArray.from_arrays(indices, dictionary)
    if kind == "huge_string":
        return pa.array(["x" * (1 << 20)] * min(length, 2) + [""] * max(length - 2, 0), pa.large_string())
    text = draw(st.lists(st.text(max_size=20), min_size=length, max_size=length))
    if kind == "binary":
        return pa.array([t.encode() for t in text], pa.binary())
    return pa.array(text, pa.string() if kind == "string" else pa.large_string())


@st.composite
def arrow_arrays(draw: st.DrawFn, length: int, depth: int = 0) -> pa.Array:
    """An array of exactly ``length`` values, nested up to four levels."""
    kinds = ["primitive", "primitive", "other"]
    if depth < 4 and length <= 64:
        kinds += ["list", "large_list", "fixed_size_list", "fixed_size_list", "struct", "map"]
    kind = draw(st.sampled_from(kinds))
    if kind == "primitive":
        return draw(primitive_arrays(length))
    if kind == "other":
        return draw(other_leaf_arrays(length))
    if kind == "fixed_size_list":
        size = draw(st.sampled_from([0, 1, 3, 4, 8, 16, 32, 64]))
        child = draw(arrow_arrays(length * size, depth + 1))
        return pa.Array.from_buffers(pa.list_(child.type, size), length, [None], children=[child])
    if kind == "struct":
        children = [draw(arrow_arrays(length, depth + 1)) for _ in range(draw(st.integers(1, 2)))]
        return pa.StructArray.from_arrays(children, names=[f"f{i}" for i in range(len(children))])
    lengths = draw(st.lists(st.integers(0, 8), min_size=length, max_size=length))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    if kind == "map":
        keys = pa.array([f"k{i}" for i in range(int(offsets[-1]))])
        items = draw(primitive_arrays(int(offsets[-1])))
        return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items)
    child = draw(arrow_arrays(int(offsets[-1]), depth + 1))
    mask = None
    if length and draw(st.booleans()):
        mask = pa.array(np.random.default_rng(length).random(length) < 0.2)
    if kind == "large_list":
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), child, mask=mask)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), child, mask=mask)


@st.composite
def record_batches(draw: st.DrawFn) -> pa.RecordBatch:
    length = draw(st.integers(0, 12))
    names = draw(st.lists(st.sampled_from(COLUMN_NAMES), min_size=0, max_size=3))
    columns = [draw(arrow_arrays(length)) for _ in names]
    if not names:
        return pa.RecordBatch.from_arrays([], schema=pa.schema([]))
    return pa.RecordBatch.from_arrays(columns, names=names)


@st.composite
def well_formed_batches(draw: st.DrawFn) -> tuple[str, pa.RecordBatch]:
    """A batch one of the models accepts, as a starting point for mutations."""
    model = draw(st.sampled_from(sorted(MODELS)))
    rows = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns = {}
    for spec in MODELS[model]:
        dims = [3 if dim == -1 else dim for dim in spec.shape]
        values = rng.integers(0, 100, size=(rows, *dims)).astype(spec.dtype)
        flat = pa.array(values.reshape(-1))
        for size in reversed(dims):
            flat = pa.FixedSizeListArray.from_arrays(flat, size)
        columns[spec.name] = flat
    return model, pa.record_batch(columns)


# -- properties ---------------------------------------------------------------------------------------


@HOSTILE
@given(batch=record_batches(), model=st.sampled_from(sorted(MODELS)))
def test_random_schemas_and_values_are_decoded_or_refused_as_invalid(
    batch: pa.RecordBatch, model: str
) -> None:
    decode_for_model(encode_batch(batch), model)


@HOSTILE
@given(payload=st.binary(max_size=2048), model=st.sampled_from(sorted(MODELS)))
@example(payload=b"\xff\xff\xff\xff\xff\xff\xff\x7f", model="vector")  # continuation, absurd length
@example(payload=b"\xff\xff\xff\xff\x00\x00\x00\x00", model="vector")  # end of stream only
def test_random_bytes_are_refused_as_invalid(payload: bytes, model: str) -> None:
    assert decode_for_model(payload, model) is None


@HOSTILE
@given(data=st.data(), start=well_formed_batches())
def test_truncated_payloads_are_refused_as_invalid(
    data: st.DataObject, start: tuple[str, pa.RecordBatch]
) -> None:
    """Cut anywhere: refused, unless the cut falls between whole messages (after the schema: a
    batch of zero rows, the documented form of an empty batch; before the end marker: the batch)."""
    model, batch = start
    payload = encode_batch(batch)
    cut = data.draw(st.integers(0, len(payload) - 1))
    decoded = decode_for_model(payload[:cut], model)
    if decoded is not None:
        assert {len(array) for array in decoded.values()} <= {0, batch.num_rows}


@HOSTILE
@given(data=st.data(), start=well_formed_batches())
def test_bit_flipped_payloads_are_decoded_or_refused_as_invalid(
    data: st.DataObject, start: tuple[str, pa.RecordBatch]
) -> None:
    model, batch = start
    payload = bytearray(encode_batch(batch))
    for _ in range(data.draw(st.integers(1, 8))):
        bit = data.draw(st.integers(0, 8 * len(payload) - 1))
        payload[bit // 8] ^= 1 << (bit % 8)
    decode_for_model(bytes(payload), model)


@HOSTILE
@given(
    data=st.data(),
    start=well_formed_batches(),
    value=st.sampled_from(ABSURD_LENGTHS),
    width=st.sampled_from(["<i", "<q"]),
)
def test_absurd_lengths_written_over_the_payload_are_refused_as_invalid(
    data: st.DataObject, start: tuple[str, pa.RecordBatch], value: int, width: str
) -> None:
    """Every 4- or 8-byte field of the IPC stream (metadata lengths, row counts, buffer offsets and
    sizes, list sizes) is a place where an attacker can declare an absurd length."""
    model, batch = start
    payload = bytearray(encode_batch(batch))
    size = struct.calcsize(width)
    position = data.draw(st.integers(0, len(payload) - size))
    if width == "<i" and not -(1 << 31) <= value < (1 << 31):
        value = (1 << 31) - 1
    struct.pack_into(width, payload, position, value)
    decode_for_model(bytes(payload), model)


def declared_length_patched(batch: pa.RecordBatch, rows: int, new_rows: int) -> bytes:
    """``batch`` encoded, with every 8-byte field equal to its row count (the record batch's
    length and its field nodes' lengths) rewritten to ``new_rows``."""
    payload = encode_batch(batch)
    return payload.replace(struct.pack("<q", rows), struct.pack("<q", new_rows))


@pytest.mark.parametrize("new_rows", [1 << 20, 1 << 40, (1 << 62)])
@pytest.mark.parametrize("model", ["free", "free_matrix"])
def test_zero_width_rows_cannot_claim_more_rows_than_the_payload_has_bits(model: str, new_rows: int) -> None:
    """Lists of length zero take no bytes: without a bound, a few hundred bytes could declare
    2**62 rows and the batcher would try to cut them into chunks."""
    rows = 7777
    spec = MODELS[model][0]
    row_type = pa.from_numpy_dtype(np.dtype(spec.dtype))
    for dim in reversed(spec.shape):
        row_type = pa.list_(row_type, 0 if dim == -1 else dim)
    batch = pa.record_batch({spec.name: pa.array([[]] * rows, row_type)})
    payload = declared_length_patched(batch, rows, new_rows)
    with pytest.raises(ArrowPayloadError, match=f"declares {new_rows} rows in {len(payload)} bytes"):
        decode_batch(payload)


def test_a_null_column_cannot_claim_more_rows_than_the_payload_has_bits() -> None:
    batch = pa.record_batch({"features": pa.nulls(7777)})
    with pytest.raises(ArrowPayloadError, match="declares 4611686018427387904 rows"):
        decode_batch(declared_length_patched(batch, 7777, 1 << 62))


@pytest.mark.parametrize(
    "column_type",
    [
        pa.sparse_union([pa.field("a", pa.int8())]),
        pa.dense_union([pa.field("a", pa.float32())]),
        pa.sparse_union([]),
        pa.list_(pa.sparse_union([])),
        pa.float32(),
    ],
    ids=[
        "sparse union",
        "dense union",
        "union without children",
        "list of unions without children",
        "float32",
    ],
)
def test_a_schema_without_a_batch_is_zero_rows_or_refused_as_invalid(column_type: pa.DataType) -> None:
    """The documented form of an empty batch; pyarrow cannot build empty union columns, and
    crashes the process on some ways of trying (both found by the atheris fuzzer)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([pa.field("features", column_type)])):
        pass
    try:
        batch = decode_batch(sink.getvalue().to_pybytes())
    except ArrowPayloadError as exc:
        assert "no record batch" in str(exc)
    else:
        assert batch.num_rows == 0 and batch.schema.field("features").type == column_type


@pytest.mark.parametrize("with_batch", [True, False], ids=["with a batch", "schema only"])
@pytest.mark.parametrize("where", ["column", "nested field"])
def test_names_that_are_not_utf8_are_refused_as_invalid(where: str, with_batch: bool) -> None:
    """Found by the atheris fuzzer: pyarrow decodes names strictly wherever they are read."""
    child = pa.array([{"qz": 1.0}]) if where == "nested field" else pa.array([1.0])
    batch = pa.record_batch({"qy" if where == "column" else "features": child})
    if with_batch:
        payload = encode_batch(batch)
    else:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema):
            pass
        payload = sink.getvalue().to_pybytes()
    forged = payload.replace(b"qy" if where == "column" else b"qz", b"\xff\xfe")
    assert forged != payload
    with pytest.raises(ArrowPayloadError, match="not a valid Arrow IPC stream"):
        decode_batch(forged)


@pytest.mark.parametrize("nested", [False, True], ids=["column", "list of"])
def test_a_type_pyarrow_cannot_read_is_refused_as_invalid(nested: bool) -> None:
    """Found by the atheris fuzzer: an interval in months (one byte away from the month-day-nano
    interval in the schema message) has no pyarrow array class; reading it raised KeyError."""
    interval = pa.array([(1, 2, 3)], pa.month_day_nano_interval())
    column = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), interval) if nested else interval
    payload = encode_batch(pa.record_batch({"features": column}))
    for position in range(len(payload) - 1):  # the interval unit: MONTH_DAY_NANO (2) to YEAR_MONTH (0)
        forged = payload[:position] + b"\x00\x00" + payload[position + 2 :]
        if payload[position : position + 2] != b"\x02\x00" or forged == payload:
            continue
        try:
            schema = pa.ipc.open_stream(forged).schema
        except pa.ArrowException:
            continue
        if "month_interval" in str(schema.field(0).type):
            break
    else:
        pytest.fail("no schema with an interval in months could be forged")
    with pytest.raises(ArrowPayloadError, match="cannot be read here"):
        decode_batch(forged)


def compressed(batch: pa.RecordBatch, codec: str) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_bodies_are_refused_as_invalid(codec: str) -> None:
    """Clients never compress (a stream on one host gains nothing), and a compressed body declares
    its own uncompressed size: 8 bytes could ask the server to allocate 2**62 bytes."""
    batch = pa.record_batch(
        {"features": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(128, "f4")), 64)}
    )
    with pytest.raises(ArrowPayloadError, match="compress"):
        decode_batch(compressed(batch, codec))


@pytest.mark.parametrize("declared_bytes", [1 << 33, 1 << 62])
def test_a_decompression_bomb_is_refused_before_anything_is_allocated(declared_bytes: int) -> None:
    batch = pa.record_batch(
        {"features": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(128, "f4")), 64)}
    )
    payload = compressed(batch, "zstd")
    bomb = payload.replace(struct.pack("<q", 128 * 4), struct.pack("<q", declared_bytes))
    assert bomb != payload, "the buffer's declared uncompressed size was not found"
    with pytest.raises(ArrowPayloadError):
        decode_batch(bomb)
