"""Which KServe front end serves: ``--kserve-frontend auto|python|native``, resolved at start.

``auto`` (the default) serves with the native front end wherever it can: a KServe port or socket
is configured (``--kserve-port``, ``--kserve-socket``: the native front end listens on a port or
a unix socket of its own) and the compiled module loads here. Against a real Triton the native
front end is 1.03-3.18x Triton's rows/s at all 9 points of the measured gRPC grid, the python
one 0.36-2.74x and at least 1.0x at only 4 of them (docs/benchmarks.md, section 6), so it is
what a server that has it should run.

Where the module is not built, or cannot load (a wheel built without grpc++, an image whose base
could not compile it, a missing shared library), ``auto`` falls back to the python front end,
which then listens on ``--kserve-port`` and ``--kserve-socket`` too: the port or socket a deployment
published answers KServe either way, only more slowly, and the start-up log says why at WARNING.
Without either, ``auto`` is the python front end on the main listeners, as it always was.

The explicit values keep their meaning: ``python`` never loads the module (and refuses a
``--kserve-port`` or ``--kserve-socket``), ``native`` fails the start where the module does not load.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from udfserve.services.model_server.frontends.kserve.native import (
    NativeFrontendUnavailable,
    load_frontend_module,
)

logger = logging.getLogger(__name__)

ServedFrontend = Literal["python", "native"]


@dataclass(frozen=True)
class KServeFrontendChoice:
    """The front end that serves KServe, and why (written to the start-up log and the ready file)."""

    frontend: ServedFrontend
    reason: str
    fallback: bool = False
    """``auto`` wanted the native front end (a KServe port or socket is configured) and could not
    load it: the python front end then listens on ``--kserve-port`` and ``--kserve-socket`` too."""


def choose_kserve_frontend(
    requested: str, kserve_port: int | None, kserve_socket: Path | None = None
) -> KServeFrontendChoice:
    """Resolve ``--kserve-frontend`` (``requested``) with ``--kserve-port`` and ``--kserve-socket``;
    the configuration checks have already refused ``native`` without either and ``python`` with one."""
    if requested == "python":
        return KServeFrontendChoice("python", "--kserve-frontend python")
    if requested == "native":
        return KServeFrontendChoice("native", "--kserve-frontend native")
    if kserve_port is None and kserve_socket is None:
        return KServeFrontendChoice(
            "python",
            "--kserve-frontend auto without --kserve-port or --kserve-socket: the native front end needs a "
            "listener of its own, so the python one serves KServe on the main listeners",
        )
    try:
        load_frontend_module()
    except NativeFrontendUnavailable as exc:
        flags = " and ".join(
            flag
            for flag, value in (("--kserve-port", kserve_port), ("--kserve-socket", kserve_socket))
            if value is not None
        )
        return KServeFrontendChoice(
            "python",
            f"--kserve-frontend auto fell back to the python front end, on {flags} and the main "
            f"listeners (slower for many small requests): {exc}",
            fallback=True,
        )
    return KServeFrontendChoice("native", "--kserve-frontend auto: the native module is built here and loads")


def log_kserve_frontend(choice: KServeFrontendChoice, kserve_address: str | None) -> None:
    """Say at start which front end serves KServe, where, and why: at WARNING when ``auto`` fell back
    to the python front end, so an image or a wheel built without the module is noticed."""
    where = kserve_address or "the main gRPC listeners"
    if choice.fallback:
        logger.warning(
            "KServe front end: python, on %s and the main gRPC listeners (%s)", where, choice.reason
        )
    else:
        logger.info("KServe front end: %s, on %s (%s)", choice.frontend, where, choice.reason)
