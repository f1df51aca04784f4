"""KServe v2 tensors as numpy arrays and Arrow batches, for both sides of the protocol.

The server decodes request tensors with these functions and the Spark client builds its
requests and reads its answers with them, so the two agree on every rule by construction. This
module knows no protobuf message: building and reading the messages that ``tritonclient`` ships
is ``udfserve.spark_client.wire.kserve_messages`` on the client and ``frontends/kserve`` in the server, so the
shared layer does not need ``tritonclient`` installed.

Tensors
    Numeric and BOOL tensors travel as raw little-endian bytes (``raw_input_contents`` /
    ``raw_output_contents``) or in the typed ``contents`` fields; both decode to one numpy
    array without per-element Python. BOOL is one byte per value. BYTES tensors (strings, a
    model's ``tf.string``) are numpy object arrays of ``bytes``; in raw form each element is
    a 4-byte little-endian length followed by its bytes, as Triton encodes them
    (``tritonclient.utils.serialize_byte_tensor``), in typed form ``contents.bytes_contents``.

Arrow columns
    A column is a primitive array (one value per row) or nested ``list`` / ``large_list`` /
    ``fixed_size_list`` levels; every list of one level must have the same length in the whole
    batch, since a KServe tensor is rectangular. Nulls are refused. String and binary values
    (``string``, ``large_string``, ``binary``, ``large_binary``) become BYTES, text as its
    UTF-8 bytes; a BYTES output comes back as a ``binary`` column. When the caller knows the
    model's per-row shape (``TensorSpec``), a column whose values per row equal the shape's
    element count is reshaped to it (Spark's flat ``array<float>`` for a matrix input, or a
    primitive column for a ``[1]`` input).

Coercion to a declared datatype (``coerce``), the same rules as the Arrow path of the server
    - floating-point targets accept any integer or floating-point values; narrowing FP64 to
      FP32 is accepted on purpose and a value beyond the narrower range becomes an infinity;
    - integer targets accept integer values when every value fits, floating point is refused
      rather than truncated;
    - BOOL accepts BOOL only;
    - BYTES accepts BYTES only: numbers are never formatted into strings nor parsed out of them.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from udfserve.arrow_types import is_list_type, is_string_type

FREE_DIM = -1

NUMPY_DTYPE_OF: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
"""KServe datatypes that map to a numpy dtype (BYTES: an object array of ``bytes``); BF16 has none."""

DATATYPE_OF: dict[np.dtype, str] = {dtype: name for name, dtype in NUMPY_DTYPE_OF.items()}

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed field of ``InferTensorContents`` each datatype uses (FP16 has none: raw only)."""
_FIELD_DTYPE: dict[str, np.dtype] = {
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
}
"""The width of each integer field of ``InferTensorContents``, which holds any value of it."""

_LITTLE_ENDIAN = np.little_endian
_BYTES_LENGTH = struct.Struct("<I")
"""The length prefix of one element of a raw BYTES tensor."""


class KServeCodecError(ValueError):
    """A tensor or a column cannot be converted; the message names it, the expected and the received."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as a KServe peer declares it: ``shape`` is per row (no batch dim)."""

    name: str
    datatype: str
    shape: tuple[int, ...] = ()


# -- numpy <-> tensor bytes ------------------------------------------------------------------
def numpy_dtype(datatype: str, what: str) -> np.dtype:
    """The numpy dtype of a KServe datatype; ``what`` names the tensor in the error."""
    dtype = NUMPY_DTYPE_OF.get(datatype)
    if dtype is None:
        supported = ", ".join(NUMPY_DTYPE_OF)
        raise KServeCodecError(f"{what}: datatype {datatype!r} is not supported; expected one of {supported}")
    return dtype


def datatype_of(dtype: np.dtype, what: str) -> str:
    datatype = DATATYPE_OF.get(np.dtype(dtype))
    if datatype is None:
        raise KServeCodecError(
            f"{what}: numpy dtype {np.dtype(dtype)} has no KServe datatype; expected one of "
            f"{', '.join(str(d) for d in DATATYPE_OF)}"
        )
    return datatype


def element_count(shape: Sequence[int], what: str) -> int:
    if any(dim < 0 for dim in shape):
        raise KServeCodecError(f"{what}: shape {list(shape)} has a negative dimension; expected sizes >= 0")
    return math.prod(shape)


def tensor_from_raw(raw: bytes, datatype: str, shape: Sequence[int], what: str) -> np.ndarray:
    """A read-only view of ``raw`` as an array of ``shape`` (no copy on little-endian hosts)."""
    dtype = numpy_dtype(datatype, what)
    count = element_count(shape, what)
    if datatype == "BYTES":
        return deserialize_bytes(raw, count, what).reshape(tuple(shape))
    expected_bytes = count * dtype.itemsize
    if len(raw) != expected_bytes:
        raise KServeCodecError(
            f"{what}: shape {list(shape)} of {datatype} needs {expected_bytes} bytes of raw contents, "
            f"received {len(raw)} bytes"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=count)
    if not _LITTLE_ENDIAN:
        array = array.astype(dtype)
    return array.reshape(tuple(shape))


def tensor_from_contents(contents: Any, datatype: str, shape: Sequence[int], what: str) -> np.ndarray:
    """The typed ``contents`` field of a tensor (an ``InferTensorContents`` message, read by field
    name so that this module needs no generated code) as an array of ``shape``."""
    dtype = numpy_dtype(datatype, what)
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise KServeCodecError(
            f"{what}: {datatype} has no typed contents field; send it in raw_input_contents"
        )
    count = element_count(shape, what)
    values = getattr(contents, field)
    if len(values) != count:
        raise KServeCodecError(
            f"{what}: shape {list(shape)} needs {count} values in contents.{field}, received {len(values)}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(tuple(shape))
    if dtype.kind in "iu":
        # the typed fields are 32 or 64 bits wide whatever the datatype: INT8 comes as int32s
        wide = np.array(values, dtype=_FIELD_DTYPE[field])
        info = np.iinfo(dtype)
        if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
            bad = int(np.flatnonzero((wide < info.min) | (wide > info.max))[0])
            raise KServeCodecError(
                f"{what}: contents.{field} value {int(wide[bad])} (element {bad}) is outside the range of "
                f"{datatype}; expected values in [{info.min}, {info.max}]"
            )
        return wide.astype(dtype).reshape(tuple(shape))
    return np.array(values, dtype=dtype).reshape(tuple(shape))


def deserialize_bytes(raw: bytes, count: int, what: str) -> np.ndarray:
    """``count`` length-prefixed elements of a raw BYTES tensor as an object array of ``bytes``.

    The prefixes chain, each element's position depending on the lengths before it, so this is
    one pass in Python (what ``tritonclient.utils.deserialize_bytes_tensor`` does too); every
    length is checked against the bytes left, and nothing may follow the last element.
    """
    size, position = len(raw), 0
    if count * _BYTES_LENGTH.size > size:  # checked before allocating: the shape is the sender's word
        raise KServeCodecError(
            f"{what}: {count} BYTES elements need at least {count * _BYTES_LENGTH.size} bytes of raw "
            f"contents (a 4-byte length each), received {size} bytes"
        )
    values = np.empty(count, dtype=object)
    for index in range(count):
        if position + _BYTES_LENGTH.size > size:
            raise KServeCodecError(
                f"{what}: raw BYTES contents end after {index} of {count} elements ({size} bytes); expected "
                "a 4-byte little-endian length before every element"
            )
        (length,) = _BYTES_LENGTH.unpack_from(raw, position)
        position += _BYTES_LENGTH.size
        if position + length > size:
            raise KServeCodecError(
                f"{what}: element {index} of the raw BYTES contents declares {length} bytes, but only "
                f"{size - position} bytes are left"
            )
        values[index] = bytes(raw[position : position + length])
        position += length
    if position != size:
        raise KServeCodecError(
            f"{what}: raw BYTES contents hold {size - position} bytes beyond the {count} elements of the "
            "tensor's shape; expected exactly one length-prefixed element per value"
        )
    return values


def serialize_bytes(array: np.ndarray, what: str = "tensor") -> bytes:
    """An object array of ``bytes`` (or ``str``, sent as UTF-8) in C order as raw BYTES contents."""
    parts = []
    for value in np.ascontiguousarray(array).reshape(-1):
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif not isinstance(value, bytes | bytearray | memoryview | np.bytes_):
            raise KServeCodecError(
                f"{what}: expected bytes or str elements in a BYTES tensor, received {type(value).__name__}"
            )
        value = bytes(value)
        parts.append(_BYTES_LENGTH.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def tensor_to_raw(array: np.ndarray) -> bytes:
    """The raw little-endian bytes of ``array`` in C order (one copy, into Python bytes); an object
    array is a BYTES tensor, length-prefixed element by element."""
    if array.dtype == object:
        return serialize_bytes(array)
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not _LITTLE_ENDIAN):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def coerce(array: np.ndarray, datatype: str, what: str) -> np.ndarray:
    """``array`` as the numpy dtype of ``datatype``, by the rules in the module docstring."""
    target = numpy_dtype(datatype, what)
    source = array.dtype
    if source == target:
        return array
    received = DATATYPE_OF.get(source, str(source))
    if datatype == "BYTES":
        accepted, allowed = False, "BYTES"  # only an object array is BYTES, and it equals the target
    elif target.kind == "f":
        accepted, allowed = source.kind in "iuf", "integer or floating-point"
    elif target.kind in "iu":
        accepted, allowed = source.kind in "iu", "integer"
    else:
        accepted, allowed = source.kind == "b", "BOOL"
    if not accepted:
        raise KServeCodecError(
            f"{what}: expected datatype {datatype} (accepting {allowed} values), received {received}"
        )
    if target.kind in "iu" and array.size and not np.can_cast(source, target, casting="safe"):
        info = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise KServeCodecError(
                f"{what}: expected {datatype} values in [{info.min}, {info.max}], received {received} "
                f"values in [{low}, {high}]"
            )
    with np.errstate(over="ignore"):  # documented: beyond the narrower float range becomes +-inf
        return array.astype(target)


# -- Arrow columns <-> tensors ------------------------------------------------------------


def _bytes_objects(values: pa.Array) -> np.ndarray:
    """String or binary values as an object array of ``bytes`` (text cast to binary: no decoding)."""
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    return values.to_numpy(zero_copy_only=False)


def column_to_tensor(column: pa.Array, what: str, spec: TensorSpec | None = None) -> np.ndarray:
    """One column as an array of shape ``(rows, *per_row)``; reshaped and coerced to ``spec``."""
    rows = len(column)
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise KServeCodecError(f"{what}: expected no nulls, received a null row {row}")
    dims: list[int] = []
    values: pa.Array = column
    lists = rows
    while is_list_type(values.type):
        level = len(dims) + 1
        if pa.types.is_fixed_size_list(values.type):
            length = values.type.list_size
        else:
            lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
            length = int(lengths[0]) if lists else 0
            bad = np.flatnonzero(lengths != length)
            if bad.size:
                index = int(bad[0])
                raise KServeCodecError(
                    f"{what}: expected lists of one length at nesting level {level} (a tensor is "
                    f"rectangular); row 0 has length {length}, received length {int(lengths[index])} in row "
                    f"{index // max(lists // max(rows, 1), 1)}"
                )
        dims.append(length)
        values = values.flatten()
        lists *= length
        if values.null_count:
            index = pc.index(pc.is_null(values), True).as_py()
            raise KServeCodecError(
                f"{what}: expected no nulls, received a null value inside row "
                f"{index // max(lists // max(rows, 1), 1)}"
            )
    if is_string_type(values.type):
        array = _bytes_objects(values).reshape((rows, *dims))
    elif (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        array = values.to_numpy(zero_copy_only=False).reshape((rows, *dims))
    else:
        raise KServeCodecError(
            f"{what}: expected numeric, boolean or string values, received type {column.type} (values of "
            f"type {values.type})"
        )
    if spec is None:
        return array
    return coerce(reshape_to_spec(array, spec, what), spec.datatype, what)


def reshape_to_spec(array: np.ndarray, spec: TensorSpec, what: str) -> np.ndarray:
    """``array`` (rows first) in the per-row shape of ``spec``: as it is when it matches (a free
    ``-1`` matches any size), reshaped when the values per row are as many as the shape holds."""
    rows, received = array.shape[0], tuple(array.shape[1:])
    wanted = spec.shape
    if rows == 0:  # an empty variable-length list column says nothing of the per-row shape
        return array.reshape((0, *(max(dim, 0) for dim in wanted)))
    if len(wanted) == len(received) and all(
        w in (FREE_DIM, r) for w, r in zip(wanted, received, strict=True)
    ):
        return array
    per_row = math.prod(received)
    if FREE_DIM not in wanted and math.prod(wanted) == per_row:
        return array.reshape((rows, *wanted))
    raise KServeCodecError(
        f"{what}: expected per-row shape {list(wanted)} (-1 = free), received per-row shape {list(received)} "
        f"({per_row} values per row)"
    )


def tensor_to_arrow(array: np.ndarray) -> pa.Array:
    """Nested ``fixed_size_list`` levels around the flat values; no copy when contiguous. BYTES
    values become a ``binary`` column."""
    array = np.ascontiguousarray(array)
    result = pa.array(array.reshape(-1), type=pa.binary() if array.dtype == object else None)
    for axis in range(array.ndim - 1, 0, -1):
        result = pa.FixedSizeListArray.from_arrays(result, array.shape[axis])
    return result
