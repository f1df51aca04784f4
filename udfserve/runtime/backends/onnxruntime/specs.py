"""An ONNX graph's inputs and outputs as the server's tensor specs, and their agreement with
config.yaml.

ONNX Runtime reports each tensor's element type (``tensor(float)``) and shape, a dimension being
a number, a symbol (``"batch"``) or unknown (``None``). The first dimension of every input and
output is the batch: it must be free (a symbol or unknown), else the graph serves one batch size
only and is refused. Other free dimensions become ``FREE_DIM``. Element types map to the
project's dtypes by name; one the server does not carry (``uint32``, ``bfloat16``, a sequence or
a map) is refused, naming the tensor.
"""

from __future__ import annotations

from typing import Any

from udfserve.runtime.backends.spec_agreement import SpecMismatch
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, SUPPORTED_DTYPES, TensorSpec

ONNX_DTYPES = {
    "tensor(float16)": "float16",
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
    "tensor(string)": STRING_DTYPE,
}
"""ONNX element types (as ONNX Runtime names them) and the dtype each is served as."""
assert set(ONNX_DTYPES.values()) <= set(SUPPORTED_DTYPES)


def graph_specs(kind: str, node_args: list[Any]) -> tuple[TensorSpec, ...]:
    """``kind`` ("input" or "output") specs of ONNX Runtime's ``NodeArg``s (name, type, shape)."""
    return tuple(_spec(kind, arg.name, arg.type, arg.shape) for arg in node_args)


def _spec(kind: str, name: str, onnx_type: str, shape: list[Any] | None) -> TensorSpec:
    dtype = ONNX_DTYPES.get(onnx_type)
    if dtype is None:
        served = ", ".join(ONNX_DTYPES)
        raise SpecMismatch(
            f"{kind} {name!r} has element type {onnx_type}, which is not served; expected one of {served}"
        )
    dims = list(shape or [])
    if not dims:
        raise SpecMismatch(
            f"{kind} {name!r} has no batch dimension (a scalar, or a tensor of unknown rank); expected a "
            "first dimension left free for the batch (a symbol such as 'batch', or unknown)"
        )
    if isinstance(dims[0], int) and dims[0] >= 0:
        raise SpecMismatch(
            f"{kind} {name!r} has a fixed batch dimension {dims[0]} (shape {dims}); expected the first "
            "dimension free for the batch: export with a dynamic axis (a symbol such as 'batch')"
        )
    row_shape = tuple(int(dim) if isinstance(dim, int) and dim >= 0 else FREE_DIM for dim in dims[1:])
    return TensorSpec(name=name, dtype=dtype, shape=row_shape)
