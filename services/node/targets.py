"""The Prometheus targets file: how Prometheus finds every process of the node.

Written next to the discovery file, in the format of Prometheus's file-based service
discovery (``file_sd_configs``): one target per model server (its HTTP admin app, which
serves ``/metrics``) and one for the supervisor. Each process exports only its own series
(its serving metrics, the GPU it is pinned to; the supervisor its restarts), and nothing
aggregates them, so no series is scraped twice. Prometheus re-reads the file when it changes,
so a restarted server on a new port is picked up without a reload.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

from udfserve.discovery import ServerEntry

WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def advertised_address(address: str, advertise_host: str | None) -> str:
    """``address`` ("host:port") as another process should dial it."""
    host, _, port = address.rpartition(":")
    if advertise_host:
        host = advertise_host
    elif host in WILDCARD_HOSTS:
        host = socket.gethostname()
    return f"{host}:{port}"


def server_target(entry: ServerEntry, node: str, advertise_host: str | None) -> dict[str, object]:
    if entry.http_address is None:
        raise ValueError(f"server on {entry.device} has no HTTP address to scrape")
    labels = {"node": node, "role": "model_server", "device": entry.device}
    if entry.device_index is not None:
        labels["device_index"] = str(entry.device_index)
    if entry.device_uuid:
        labels["device_uuid"] = entry.device_uuid
    return {"targets": [advertised_address(entry.http_address, advertise_host)], "labels": labels}


def supervisor_target(address: str, node: str, advertise_host: str | None) -> dict[str, object]:
    return {
        "targets": [advertised_address(address, advertise_host)],
        "labels": {"node": node, "role": "supervisor"},
    }


def write_targets(path: Path, targets: list[dict[str, object]]) -> None:
    """Replace the targets file atomically: Prometheus must never read half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            json.dump(targets, tmp, indent=2, sort_keys=True)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
