"""The interface every backend implements: load a model from the repository, run a batch.

Kept free of any framework import so the repository, the batcher and the Spark client can name
these types without pulling TensorFlow (or, later, ONNX Runtime or PyTorch) into the process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import TensorSpec


@runtime_checkable
class LoadedModel(Protocol):
    """A model ready to serve. ``inputs`` and ``outputs`` carry per-row shapes (no batch dim)."""

    name: str
    version: int
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Blocking; called from a worker thread.

        ``inputs`` holds one array per declared input, already of the declared dtype and of
        shape ``(rows, *shape)``; the result holds one array per output with the same rows.
        """
        ...


class Backend(Protocol):
    """Turns a ``ModelSource`` into a ``LoadedModel``, raising ``ModelLoadError`` on failure."""

    platform: str

    def load(self, source: ModelSource) -> LoadedModel: ...
