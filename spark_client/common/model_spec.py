"""What the client knows of a model: its inputs and outputs, and the Arrow and Spark types they map to.

Fetched once in the driver (``GetModelMetadata``, or from the loaded model on the CPU
fallback) and frozen into the UDF, so that every task sends the same column names and every
path (server or fallback) produces the same Arrow types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_ARROW_TYPES = {
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "bool": pa.bool_(),
    "string": pa.binary(),
}
"""Value types by dtype name; a ``string`` tensor (``tf.string``, KServe BYTES) holds bytes, which
Spark reads as ``binary``."""

_SPARK_VALUE_TYPES = {"float16": pa.float32(), "uint8": pa.int16()}


@dataclass(frozen=True)
class Tensor:
    """One input or output: numpy dtype name (or ``string``) and per-row shape (-1 for a free dimension)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def arrow_type(self) -> pa.DataType:
        """The type the server answers with: nested fixed-size lists around the values."""
        arrow_type = _value_type(self)
        for dim in reversed(self.shape):
            arrow_type = pa.list_(arrow_type, dim) if dim >= 0 else pa.list_(arrow_type)
        return arrow_type

    def spark_arrow_type(self) -> pa.DataType:
        """The type Spark accepts: variable-size lists (Spark has no fixed-size arrays), and
        the nearest Spark numeric type for the ones Spark lacks (float16, uint8)."""
        arrow_type = _SPARK_VALUE_TYPES.get(self.dtype) or _value_type(self)
        for _ in self.shape:
            arrow_type = pa.list_(arrow_type)
        return arrow_type


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def input_bytes_per_row(self) -> int | None:
        """The bytes of one row's input values as numpy holds them (a byte per bool; Arrow packs
        bools in bits, KServe does not), or None when a row's size is not fixed (a free
        dimension, or a string tensor)."""
        total = 0
        for tensor in self.inputs:
            if tensor.dtype == "string" or any(dim < 0 for dim in tensor.shape):
                return None
            value_bytes = max(_value_type(tensor).bit_width, 8) // 8
            total += int(np.prod(tensor.shape, dtype=np.int64)) * value_bytes
        return total

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(t.name, t.arrow_type()) for t in self.outputs])

    def empty_outputs(self) -> pa.RecordBatch:
        """Zero rows of the outputs, for an empty Spark batch: no call is made for it.

        Built with ``pa.nulls``: ``pa.array`` imports pandas, which a ``mapInArrow`` worker never
        needs (see ``udfserve.spark_client.executor.convert``)."""
        return pa.RecordBatch.from_arrays(
            [pa.nulls(0, type=t.arrow_type()) for t in self.outputs], names=list(self.output_names)
        )


def spec_from_tensors(
    name: str,
    version: int,
    inputs: Iterable[tuple[str, str, Iterable[int]]],
    outputs: Iterable[tuple[str, str, Iterable[int]]],
) -> ModelSpec:
    return ModelSpec(
        name=name,
        version=version,
        inputs=tuple(Tensor(n, d, tuple(int(x) for x in s)) for n, d, s in inputs),
        outputs=tuple(Tensor(n, d, tuple(int(x) for x in s)) for n, d, s in outputs),
    )


def _value_type(tensor: Tensor) -> pa.DataType:
    if tensor.dtype in _ARROW_TYPES:
        return _ARROW_TYPES[tensor.dtype]
    try:
        return _ARROW_TYPES[np.dtype(tensor.dtype).name]
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"tensor {tensor.name!r} has dtype {tensor.dtype!r}; expected one of {sorted(_ARROW_TYPES)}"
        ) from exc
