"""``<repo>/<model>/config.yaml``, validated: which backend, version and batch limits a model has.

The model server reads it to batch a model's requests, the CPU fallback to cut its batches; the
name rule also guards every path built from a model name.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from udfserve.runtime.tensor_spec import TensorSpec

MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_QUEUE_BATCHES = 64
"""Default queue bound, in full batches: room for the in-flight windows of several Spark tasks
(each holds up to 4 x 4,096 rows by default) without refusing them, yet bounded."""


def validate_model_name(name: str) -> str:
    """Refuse names that could address anything outside the model repository."""
    if not MODEL_NAME_PATTERN.match(name) or name in {".", ".."} or ".." in name:
        shown = repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} characters)"
        raise ValueError(
            f"invalid model name {shown}: expected 1-128 characters of [A-Za-z0-9_.-], "
            "not starting with '.' or '-', without '..' or path separators"
        )
    return name


class BatchingConfig(BaseModel):
    """How the dynamic batcher of one model merges requests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    max_queue_delay_s: float = Field(
        default=0.002,
        ge=0.0,
        le=10.0,
        description="how long a request queued behind a running batch may wait for company; a request "
        "that finds the batcher idle starts at once, unless the last batch merged several requests "
        "less than this delay ago: then the next batch waits, at most this long after that batch "
        "finished, for as many requests as it held (their clients coming back)",
    )
    max_queue_rows: int | None = Field(
        default=None, gt=0, description="rows waiting before RESOURCE_EXHAUSTED; default 64 x max_batch_size"
    )


class ModelConfig(BaseModel):
    """``<repo>/<model>/config.yaml``. Every field is optional but the file must parse."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    backend: Literal["tensorflow"] = "tensorflow"
    version: int | None = Field(default=None, ge=1, description="pin a version; default the newest")
    max_batch_size: int = Field(default=1024, ge=1, le=1 << 20)
    dynamic_batching: BatchingConfig = Field(default_factory=BatchingConfig)
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    warmup: bool = True

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        return None if value is None else validate_model_name(value)

    @property
    def max_queue_rows(self) -> int:
        return self.dynamic_batching.max_queue_rows or DEFAULT_QUEUE_BATCHES * self.max_batch_size
