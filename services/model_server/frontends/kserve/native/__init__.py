"""The native KServe front end: a compiled module, built on the machine that serves with it.

``load_frontend_module()`` imports it, or says how to build it; nothing else in the server imports
it, so a server that does not ask for ``--kserve-frontend native`` never needs a compiler.
"""

from __future__ import annotations

import importlib
from types import ModuleType

BUILD_COMMAND = "python -m udfserve.services.model_server.frontends.kserve.native.build"


class NativeFrontendUnavailable(RuntimeError):
    """The module is not built here (or cannot be loaded); the message names the build command."""


def load_frontend_module() -> ModuleType:
    try:
        return importlib.import_module(
            "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"
        )
    except ImportError as exc:
        raise NativeFrontendUnavailable(
            f"the native KServe front end is not built here ({exc}); expected it built by `{BUILD_COMMAND}` "
            "(or bash scripts/native.sh), or --kserve-frontend python"
        ) from exc
