"""The interface every backend implements: load a model from the repository, run a batch.

Kept free of any framework import so the repository, the server and the CPU fallback can name
these types without pulling a framework into the process.

A backend is a folder of this package (``onnxruntime/``, ``tensorflow/``, ...) whose class, like
``OnnxRuntimeBackend``, has a ``platform`` name and ``load(source)`` returning a ``LoadedModel``,
and one entry in ``udfserve.runtime.backend_registry`` (its model files, framework, extra and
class), from which the scan, config.yaml's ``backend`` values and ``get_backend`` are derived;
the framework is imported by that folder only (docs/backends.md, "Adding a backend"). A backend
warms a model up with ``warmup.warm_up`` and, where its framework can stop a running call,
registers how with ``udfserve.runtime.call_bound.on_overrun``. ``predict`` receives what
``tensor_conversion`` checked and converted; a batch that does not fit the device's memory
raises ``DeviceOutOfMemory`` (the batcher then halves the call), a model that cannot be loaded
``ModelLoadError``.
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
