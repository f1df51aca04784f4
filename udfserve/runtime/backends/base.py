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
``ModelLoadError``. A backend's model derives from ``BackendModel``, which holds the fields every
loaded model has and checks that a batch names every input.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from udfserve.runtime.errors import InvalidInput
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


class BackendModel:
    """What every backend's loaded model holds: its name and version, the file it was loaded from,
    and its inputs and outputs (per-row shapes); the check a ``predict`` starts with, that the batch
    holds every input; and its ``repr``. A subclass sets ``platform`` and adds what its framework
    needs (``described`` adds to the ``repr``)."""

    platform: str

    def __init__(
        self,
        *,
        name: str,
        version: int,
        artifact: Path,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
    ) -> None:
        self.name = name
        self.version = version
        self.artifact = artifact
        self.inputs = inputs
        self.outputs = outputs

    def require_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        """``InvalidInput`` naming the inputs the batch lacks, those expected and those received."""
        missing = [spec.name for spec in self.inputs if spec.name not in inputs]
        if missing:
            raise InvalidInput(
                f"model {self.name!r}: missing input(s) {missing}; expected {[s.name for s in self.inputs]}, "
                f"received {sorted(inputs)}"
            )

    def rows(self, inputs: Mapping[str, np.ndarray]) -> int:
        """The rows of a batch that holds every input (0 for a model that takes none)."""
        return len(inputs[self.inputs[0].name]) if self.inputs else 0

    def described(self) -> dict[str, object]:
        """What the ``repr`` says beyond the name, version and file."""
        return {}

    def __repr__(self) -> str:
        details = "".join(f", {key}={value!r}" for key, value in self.described().items())
        return (
            f"{type(self).__name__}(name={self.name!r}, version={self.version}, "
            f"artifact={str(self.artifact)!r}{details})"
        )
