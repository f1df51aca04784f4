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


class SpecMismatch(Exception):
    """The graph does not fit what config.yaml declares or what the server can serve."""


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


def agreed_specs(
    kind: str, declared: tuple[TensorSpec, ...] | None, found: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    """The declared specs when they fit the graph's (the rules of the TensorFlow backend: the same
    names, strings stay strings, a declared shape may fix a dimension the graph leaves free), else
    the graph's own. Declared numeric dtypes other than the graph's are cast at each call."""
    if declared is None:
        return found
    by_name = {spec.name: spec for spec in found}
    declared_names = [spec.name for spec in declared]
    missing = [name for name in by_name if name not in declared_names]
    unknown = [name for name in declared_names if name not in by_name]
    if missing or unknown or len(set(declared_names)) != len(declared_names):
        raise SpecMismatch(
            f"config.yaml declares {kind}s {declared_names}, but the graph's {kind}s are {list(by_name)}"
            + (f"; not in the graph: {unknown}" if unknown else "")
            + (f"; not declared: {missing}" if missing else "")
        )
    for spec in declared:
        graph_dtype = by_name[spec.name].dtype
        if (spec.dtype == STRING_DTYPE) != (graph_dtype == STRING_DTYPE):
            wanted = STRING_DTYPE if graph_dtype == STRING_DTYPE else "a numeric dtype"
            raise SpecMismatch(
                f"config.yaml declares {kind} {spec.name!r} as {spec.dtype}, but the graph's is "
                f"{graph_dtype}; strings and numbers do not convert into each other: declare {wanted}"
            )
        graph_shape = by_name[spec.name].shape
        fits = len(spec.shape) == len(graph_shape) and all(
            g == FREE_DIM or d == g for d, g in zip(spec.shape, graph_shape, strict=True)
        )
        if not fits:
            raise SpecMismatch(
                f"config.yaml declares {kind} {spec.name!r} with per-row shape {list(spec.shape)}, "
                f"but the graph's is {list(graph_shape)} (-1 is free)"
            )
    return declared
