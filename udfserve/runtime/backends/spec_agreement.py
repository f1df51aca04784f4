"""config.yaml's inputs and outputs checked against the ones a model file carries.

Every backend that reads specs from its file (a Keras model's inputs, a SavedModel's signature,
an ONNX graph) follows the same rules, so a config.yaml means the same whatever the backend:
the same names, strings stay strings, and a declared shape may fix a dimension the file leaves
free, never the other way. A declared numeric dtype other than the file's is cast at each call.
"""

from __future__ import annotations

from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec


class SpecMismatch(Exception):
    """The model file does not fit what config.yaml declares or what the server can serve; the
    backend turns it into a ``ModelLoadError`` naming the file."""


def shape_fits(declared: tuple[int, ...], found: tuple[int, ...]) -> bool:
    """A declared shape may fix a dimension the file leaves free, never the other way."""
    return len(declared) == len(found) and all(
        f == FREE_DIM or d == f for d, f in zip(declared, found, strict=True)
    )


def agreed_specs(
    kind: str,
    declared: tuple[TensorSpec, ...] | None,
    found: tuple[TensorSpec, ...],
    *,
    holder: str = "model",
) -> tuple[TensorSpec, ...]:
    """The declared specs when they fit the file's (``holder`` names it in messages: "model",
    "graph"), the file's own when nothing is declared; ``SpecMismatch`` saying what differs."""
    if declared is None:
        return found
    by_name = {spec.name: spec for spec in found}
    declared_names = [spec.name for spec in declared]
    missing = [name for name in by_name if name not in declared_names]
    unknown = [name for name in declared_names if name not in by_name]
    if missing or unknown or len(set(declared_names)) != len(declared_names):
        raise SpecMismatch(
            f"config.yaml declares {kind}s {declared_names}, but the {holder}'s {kind}s are {list(by_name)}"
            + (f"; not in the {holder}: {unknown}" if unknown else "")
            + (f"; not declared: {missing}" if missing else "")
        )
    for spec in declared:
        found_dtype = by_name[spec.name].dtype
        if (spec.dtype == STRING_DTYPE) != (found_dtype == STRING_DTYPE):
            wanted = STRING_DTYPE if found_dtype == STRING_DTYPE else "a numeric dtype"
            raise SpecMismatch(
                f"config.yaml declares {kind} {spec.name!r} as {spec.dtype}, but the {holder}'s is "
                f"{found_dtype}; strings and numbers do not convert into each other: declare {wanted}"
            )
        found_shape = by_name[spec.name].shape
        if not shape_fits(spec.shape, found_shape):
            raise SpecMismatch(
                f"config.yaml declares {kind} {spec.name!r} with per-row shape {list(spec.shape)}, "
                f"but the {holder}'s is {list(found_shape)} (-1 is free)"
            )
    return declared
