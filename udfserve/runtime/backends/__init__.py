"""Backends by name. Each is imported only when asked for, so importing this package (or the
repository) never imports a framework: a framework is imported to load a model, once the process
is pinned to its device (``device.pin_device``)."""

from __future__ import annotations

from udfserve.runtime.backends.base import Backend, LoadedModel

KNOWN_BACKENDS = ("tensorflow",)

__all__ = ["KNOWN_BACKENDS", "Backend", "LoadedModel", "get_backend"]


def get_backend(name: str) -> Backend:
    """The backend for ``config.backend``; imports its framework on first use."""
    if name == "tensorflow":
        from udfserve.runtime.device import import_tensorflow

        import_tensorflow()  # first, so the framework's start-up lines go through its filter
        from udfserve.runtime.backends.tensorflow import TensorFlowBackend

        return TensorFlowBackend()
    raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(KNOWN_BACKENDS)}")
