"""What a model's input or output is: a name, a dtype and a per-row shape.

Both the model's ``config.yaml`` and a backend reading the model's own signature describe tensors
this way; the tensor conversion checks requests against it.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

WholeNumber = Annotated[int, Strict()]
"""An integer of a model's config as written. YAML reads ``true`` as a boolean and ``1.0e+3`` as a
float, and pydantic would take them for 1 and 1,000: a typo would then size a batch or a queue.
Only an integer is accepted, and the error names the field and the value."""

FREE_DIM = -1
"""A dimension of a per-row shape whose length each batch gives (one length for all its rows)."""
STRING_DTYPE = "string"

SUPPORTED_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "string",
)
"""Tensor dtypes by their TensorFlow names. ``string`` is TensorFlow's ``tf.string``: byte strings,
held in numpy as an object array of ``bytes`` (numpy has no variable-length string dtype)."""


class TensorSpec(BaseModel):
    """An input or output as declared in config.yaml (or read from the model's signature)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = Field(default=(), description="per-row shape, no batch dimension; -1 is free")
    range: tuple[int, int] | None = Field(
        default=None,
        description="[min, max], both included: the only values an integer input takes (ids of an "
        "embedding table of N rows: [0, N-1]); a request holding another is refused before it is "
        "batched. Read from the model where an input feeds a Keras Embedding directly",
    )

    @field_validator("shape", "range", mode="before")
    @classmethod
    def _whole_numbers(cls, value: object) -> object:
        """As ``WholeNumber``, but a backend's numpy integers from a model's signature pass."""
        if isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, bool | float):
                    raise ValueError(f"expected integers, got {item!r} in {list(value)}")
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported dtype {value!r}; expected one of {', '.join(SUPPORTED_DTYPES)}")
        return value

    @model_validator(mode="after")
    def _integer_range(self) -> TensorSpec:
        if self.range is None:
            return self
        low, high = self.range
        if not self.dtype.startswith(("int", "uint")):
            raise ValueError(
                f"tensor {self.name!r}: a range applies to integer dtypes only, not {self.dtype}"
            )
        info = np.iinfo(self.dtype)
        if not info.min <= low <= high <= info.max:
            raise ValueError(
                f"tensor {self.name!r}: range [{low}, {high}] must be [min, max] with min <= max, within "
                f"{self.dtype}'s [{info.min}, {info.max}]"
            )
        return self


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding a tensor of ``dtype``: ``string`` tensors are object arrays of bytes."""
    return np.dtype(object) if dtype == STRING_DTYPE else np.dtype(dtype)


def zeros(spec: TensorSpec, rows: int) -> np.ndarray:
    """A ``(rows, *shape)`` array of ``spec`` filled with zeros (empty strings), free dims 1 row long
    when ``rows`` > 0 and 0 otherwise: what warm-up calls and empty answers are made of."""
    shape = (rows, *((1 if rows else 0) if dim == FREE_DIM else dim for dim in spec.shape))
    if spec.dtype == STRING_DTYPE:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=spec.dtype)


def shape_text(shape: tuple[int, ...]) -> str:
    """A per-row shape as messages show it: ``(3,)``, ``(*, 4)`` (``*`` is free)."""
    return (
        "("
        + ", ".join("*" if dim == FREE_DIM else str(dim) for dim in shape)
        + ("," if len(shape) == 1 else "")
        + ")"
    )
