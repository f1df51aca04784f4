"""Where a started server listens and what it serves, as written to ``--ready-file``.

A supervisor (``udfserve node``) and the tests read this file instead of calling the server: it
is written once the listeners are bound, and again with the models and their versions once
loading has finished and whenever they change. It is replaced atomically, so a reader never sees
half of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BoundAddresses:
    """Where a started server listens; written to ``--ready-file`` for supervisors and tests."""

    pid: int
    device: str
    unix_socket: str | None
    tcp_address: str | None
    http_address: str | None
    kserve_address: str | None = None
    """``--kserve-port``'s host:port: the native KServe front end's, or the python one's where
    ``--kserve-frontend auto`` fell back to it; None when KServe is served on the main listeners only."""
    kserve_socket: str | None = None
    """``--kserve-socket``'s path: the native KServe front end's unix socket, or the python one's
    where ``auto`` fell back to it; None when none is configured."""
    kserve_http_address: str | None = None
    """The KServe HTTP port's host:port (``--kserve-http-port``); None when it is off."""
    kserve_frontend: str = "python"
    """The KServe front end that serves (``native`` or ``python``), as ``--kserve-frontend`` resolved."""
    models: tuple[str, ...] = ()
    """The models that loaded: the file is written again, with them, once loading has finished
    and before health reports SERVING, so a supervisor needs no call (nor the token) to know."""
    not_serving: str = ""
    """Written with the models once loading has finished, when none serves: why (the repository
    holds no servable model, or none loaded). Such a server stays up, NOT_SERVING, and a
    supervisor reads here that waiting for it is in vain."""
    versions: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Each model's versions serving, written with the models and again whenever they change
    (``--model-control poll|explicit``): what a supervisor publishes for its node."""


def write_ready_file(path: Path, addresses: BoundAddresses) -> None:
    """Replace the ready file at ``path`` with ``addresses`` as JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(addresses)), encoding="utf-8")
    os.replace(tmp, path)
