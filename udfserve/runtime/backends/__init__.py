"""Backends by name (``registry``). Each is imported only when asked for, so importing this package
(or the repository) never imports a framework: a framework is imported to load a model, once the
process is pinned to its device (``device.pin_device``)."""

from __future__ import annotations

import importlib
import importlib.util

from udfserve.runtime.backend_registry import BACKEND_NAMES, FORMAT_BY_BACKEND
from udfserve.runtime.backends.base import Backend, LoadedModel
from udfserve.runtime.errors import BackendNotInstalled

KNOWN_BACKENDS = BACKEND_NAMES

__all__ = ["KNOWN_BACKENDS", "Backend", "LoadedModel", "backend_installed", "get_backend"]


def backend_installed(name: str) -> bool:
    """Whether the framework of backend ``name`` can be imported here (found, not imported)."""
    return importlib.util.find_spec(FORMAT_BY_BACKEND[name].module) is not None


def get_backend(name: str) -> Backend:
    """The backend ``name``; imports its framework on first use. ``ValueError`` for a name no
    backend has, ``BackendNotInstalled`` naming the extra when its framework is missing."""
    if name not in FORMAT_BY_BACKEND:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(KNOWN_BACKENDS)}")
    format_ = FORMAT_BY_BACKEND[name]
    if not backend_installed(name):
        raise BackendNotInstalled(
            f"the {name} backend (for {format_.described}) is not installed here: its framework "
            f"{format_.module!r} cannot be imported; expected `pip install 'udfserve[{format_.extra}]'`"
        )
    module_name, _, class_name = format_.loader.partition(":")
    backend: Backend = getattr(importlib.import_module(module_name), class_name)()
    return backend
