"""The interface every backend implements: load a model from the repository, run a batch.

Kept free of any framework import so the repository, the server and the CPU fallback can name
these types without pulling TensorFlow (or, later, ONNX Runtime or PyTorch) into the process.

A new backend is a module of this package with a class like ``TensorFlowBackend``: a
``platform`` name and ``load(source)`` returning a ``LoadedModel``. Its name goes into
``KNOWN_BACKENDS`` and ``get_backend`` (``__init__.py``, which imports the module only when asked
for it) and into ``ModelConfig.backend``, the values a ``config.yaml`` may name; the framework is
imported by that module only. ``predict`` receives what ``tensor_conversion`` checked and
converted; a batch that does not fit the device's memory raises ``DeviceOutOfMemory`` (the
batcher then halves the call), a model that cannot be loaded ``ModelLoadError``.
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
