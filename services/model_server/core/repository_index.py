"""Triton's repository index: every model of the repository and every model a server holds,
with the state of each version (``RepositoryIndex``, KServe's repository API)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from udfserve.log_text import clip
from udfserve.runtime.model_config import validate_model_name
from udfserve.services.model_server.core.model_table import ModelTable


@dataclass(frozen=True)
class IndexEntry:
    """One model of the repository, or held by the server, as Triton's repository index lists it."""

    name: str
    version: str
    state: str
    """READY, LOADING, UNLOADING or UNAVAILABLE."""
    reason: str


def repository_index(models: ModelTable, ready_only: bool = False) -> list[IndexEntry]:
    """Every model of the repository and every model the server holds, with its versions'
    states (Triton's ``RepositoryIndex``)."""
    listed: list[IndexEntry] = []
    names = set(models.names())
    with contextlib.suppress(OSError):
        root = models.repository
        names |= {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    for name in sorted(names):
        try:
            validate_model_name(name)
        except ValueError:
            continue
        entry = models.entry(name) if name in models.names() else None
        if entry is None:
            if not ready_only:
                listed.append(IndexEntry(name, "", "UNAVAILABLE", "unloaded"))
            continue
        for version in sorted(entry.serving):
            listed.append(IndexEntry(name, str(version), "READY", ""))
        for version in sorted(entry.leased):
            listed.append(IndexEntry(name, str(version), "READY", "leased: serves the requests that name it"))
        if ready_only:
            continue
        for version in sorted(entry.loading):
            listed.append(IndexEntry(name, str(version), "LOADING", ""))
        for served in entry.draining:
            listed.append(IndexEntry(name, str(served.version), "UNLOADING", ""))
        for version, error in sorted(entry.failed_versions.items()):
            listed.append(IndexEntry(name, str(version), "UNAVAILABLE", clip(error, 1000)))
        if not (entry.serving or entry.leased or entry.loading or entry.draining or entry.failed_versions):
            listed.append(IndexEntry(name, "", "UNAVAILABLE", clip(entry.problems() or entry.state(), 1000)))
    return listed
