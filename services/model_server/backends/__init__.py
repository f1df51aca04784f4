"""Backends by name. Each is imported only when asked for, so importing this package (or the
repository) never imports a framework: the Spark client names these types on its happy path."""

from __future__ import annotations

from services.model_server.backends.base import Backend, LoadedModel

KNOWN_BACKENDS = ("tensorflow",)

__all__ = ["KNOWN_BACKENDS", "Backend", "LoadedModel", "get_backend"]


def get_backend(name: str) -> Backend:
    """The backend for ``config.backend``; imports its framework on first use."""
    if name == "tensorflow":
        from services.model_server.device import import_tensorflow

        import_tensorflow()  # first, so the framework's start-up lines go through its filter
        from services.model_server.backends.tensorflow import TensorFlowBackend

        return TensorFlowBackend()
    raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(KNOWN_BACKENDS)}")
