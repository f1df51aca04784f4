"""Which KServe front end the node's servers serve with, and why, as the doctor reports it.

``--kserve-frontend auto`` (the servers' default) serves with the native front end where its
compiled module loads and a ``--kserve-port`` is given, and falls back to the python one otherwise
(``frontends/kserve/frontend_choice.py``). Each server's ready file, and so the discovery file,
says which serves (``kserve_frontend``) and where (``kserve_address``, its ``--kserve-port``, and
``kserve_socket``, its ``--kserve-socket``); from those the reason follows: native; python on its
own KServe listeners (auto found no native module in the server's environment: slower for many
small requests, worth a warning); or python on the main listeners only (neither a
``--kserve-port`` nor a ``--kserve-socket``, or ``--kserve-frontend python``). A discovery file
written by an older node has no ``kserve_frontend``: a ``kserve_address`` there was the native
front end's.
"""

from __future__ import annotations

from typing import Any

from udfserve.discovery import NodeDiscovery, ServerEntry
from udfserve.services.doctor.report import Finding
from udfserve.services.model_server.frontends.kserve.native import BUILD_COMMAND

NAME = "native KServe front end"
PORT_HINT = "--server-args='--kserve-port 0'"
FIX = f"build it where the servers run: `{BUILD_COMMAND}` (or bash scripts/native.sh), then restart the node"


def served_frontend(server: ServerEntry) -> str:
    """``native``, ``python-port`` (auto's fallback, on its own KServe listeners) or ``python``."""
    own_listeners = bool(server.kserve_address or server.kserve_socket)
    frontend = server.kserve_frontend or ("native" if own_listeners else "python")
    if frontend == "python" and own_listeners:
        return "python-port"
    return frontend


def native_finding(loads: bool, text: str, imported: bool, discovery: NodeDiscovery | None) -> Finding:
    """The finding for the native front end: whether it is built (and loads) here, and what the
    node's ready servers serve KServe with, and why. ``text`` is the probe's error when it does not."""
    here = ("built here" + (", and it loads" if imported else "")) if loads else text
    ready = [server for server in (discovery.servers if discovery else []) if server.state == "ready"]
    by_kind: dict[str, list[str]] = {"native": [], "python-port": [], "python": []}
    for server in ready:
        by_kind[served_frontend(server)].append(server.device)
    notes = []
    if by_kind["native"]:
        native = by_kind["native"]
        notes.append(f"{_servers(native)} KServe with it, on {_own(native)} KServe port or socket")
    if by_kind["python-port"]:
        notes.append(
            f"{_servers(by_kind['python-port'])} KServe with the python front end on "
            f"{_own(by_kind['python-port'])} KServe port or socket: "
            "--kserve-frontend auto found no native module where the server runs, so small requests "
            "cost more CPU there"
        )
    if by_kind["python"]:
        notes.append(
            f"{_servers(by_kind['python'])} KServe with the python front end on the main listeners: no "
            f"--kserve-port (or --kserve-frontend python); {PORT_HINT} gives each server one, which "
            "--kserve-frontend auto, the default, serves with the native front end"
        )
    if not ready:
        notes.append(
            "servers started with a --kserve-port serve KServe with it (--kserve-frontend auto, the default)"
            if loads
            else "servers started here serve KServe with the python front end (--kserve-frontend auto "
            "falls back to it)"
        )
    fell_back = bool(by_kind["python-port"])
    facts: dict[str, Any] = {
        "built": loads,
        "servers_using_it": by_kind["native"],
        "servers_fallen_back": by_kind["python-port"],
        "servers_without_kserve_port": by_kind["python"],
    }
    return Finding(
        group="backends",
        name=NAME,
        status="warn" if fell_back else ("ok" if loads else "info"),
        summary=f"{here}; {'; '.join(notes)}",
        fix=FIX if fell_back else "",
        facts=facts,
    )


def _servers(devices: list[str]) -> str:
    """``the node's gpu:0 serves`` or ``the node's gpu:0, gpu:1 serve``."""
    return f"the node's {', '.join(devices)} serve{'s' if len(devices) == 1 else ''}"


def _own(devices: list[str]) -> str:
    """``its`` for one server, ``their`` for several."""
    return "its" if len(devices) == 1 else "their"
