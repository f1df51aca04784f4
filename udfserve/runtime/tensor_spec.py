"""What a model's input or output is: a name, a dtype and a per-row shape.

Both the model's ``config.yaml`` and a backend reading the model's own signature describe tensors
this way; the tensor conversion checks requests against it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported dtype {value!r}; expected one of {', '.join(SUPPORTED_DTYPES)}")
        return value
