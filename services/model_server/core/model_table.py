"""The models of one server process: the versions each serves, their states, and lookups.

Each model holds the versions its version policy serves, every one loaded exactly once per
process, off the event loop, so the server listens (and answers UNAVAILABLE for a model still
loading) meanwhile. A request naming no version gets the highest version that serves; one
naming a version gets it while it serves. Versions change while the server runs only through
``core.model_control`` (``--model-control poll|explicit``): a new version serves once it is
loaded and warmed up, and the one it replaces stops taking requests at that moment and drains.
A model or version that fails to load is listed with its error; the versions serving before keep
serving.

The table is read and changed on the serving event loop only; a request is admitted and queued
on a version's batcher without yielding to the loop, so a version taken out of routing receives
no new request after that moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.model_config import validate_model_name
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.core.served_model import (
    ModelInfo,
    ModelState,
    ServedModel,
    VersionLoader,
    cpu_parts,
)
from udfserve.services.model_server.errors import ModelNotFound, ModelSwapping, ModelUnavailable
from udfserve.services.model_server.observability.metrics import ModelMetrics, ServerMetrics

__all__ = ["LoadedModel", "ModelEntry", "ModelInfo", "ModelState", "ModelTable", "ServedModel", "cpu_parts"]

logger = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """One model name: the versions serving, the ones loading, and what went wrong."""

    name: str
    metrics: ModelMetrics
    serving: dict[int, ServedModel] = field(default_factory=dict)
    """Versions that take requests, by version."""
    route: ServedModel | None = None
    """The highest version serving: what a request naming no version gets."""
    loading: dict[int, ServedModel] = field(default_factory=dict)
    draining: list[ServedModel] = field(default_factory=list)
    error: str = ""
    """Why the model cannot be served (its folder), or why a version of it failed to load."""
    failed_versions: dict[int, str] = field(default_factory=dict)
    unloaded: bool = False
    """Unloaded by a call, or removed from the repository: nothing serves until a load."""
    swapping: bool = False
    """Between unloading the old versions and serving the new (``--version-swap unload-first``)."""
    available: tuple[int, ...] = ()
    config_fingerprint: str | None = None
    """The config.yaml digest the versions serving were loaded with (None: never loaded)."""
    leased: dict[int, ServedModel] = field(default_factory=dict)
    """Versions the policy no longer serves, kept for the jobs that pinned them: they answer
    requests that name them, never a request naming no version (``core.leases``)."""
    lease_until: dict[int, float] = field(default_factory=dict)
    """Per leased version, the monotonic time its lease lapses; each request naming it renews it."""
    gone: dict[int, str] = field(default_factory=dict)
    """Why versions that served were unloaded (the last few): the refusal of a request naming one."""

    def reroute(self) -> None:
        self.route = self.serving[max(self.serving)] if self.serving else None

    def state(self) -> ModelState:
        if self.route is not None:
            return "ready"
        if self.loading or self.swapping:
            return "loading"
        if self.unloaded:
            return "unloaded"
        return "failed"

    def problems(self) -> str:
        """The errors of the model and of its versions that failed, one line."""
        parts = [self.error] if self.error else []
        parts += [self.failed_versions[version] for version in sorted(self.failed_versions)]
        return "; ".join(parts)


class ModelTable:
    """Lookups of the models and the versions they serve; the gRPC and HTTP layers only read it,
    ``core.model_control`` changes it."""

    def __init__(self, config: ServerConfig, metrics: ServerMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._entries: dict[str, ModelEntry] = {}
        self.unservable = ""
        """Why the repository yields no model to load (empty, a model's own folder, ...)."""
        self.loading_done = asyncio.Event()
        self.draining = False
        self.on_state_change: Callable[[str], None] = lambda _name: None
        """Called with a model's name whenever the versions it serves change."""
        self.fault = ""
        """Why the process can no longer serve (a batcher broke for good); "" while it can."""
        self.on_fault: Callable[[str], None] = lambda _reason: None
        self.on_version_wanted: Callable[[str, int], bool] = lambda _name, _version: False
        """Called when a request names a version of the repository that is not loaded (a job pinned
        it, and this process started or replaced it since): true if it now loads, leased
        (``core.model_control``)."""
        """Called once, with ``fault``, when it is set: the server must stop and be replaced."""
        self.loader = VersionLoader(config, metrics, self._batcher_broke)

    @property
    def config(self) -> ServerConfig:
        return self._config

    @property
    def metrics(self) -> ServerMetrics:
        return self._metrics

    def entry(self, name: str) -> ModelEntry:
        """The entry of ``name``, made (with its series) on first use."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = ModelEntry(name=name, metrics=self._metrics.for_model(name))
            self._metrics.track_queue(name, lambda: _queued_rows(entry))
        return entry

    def _batcher_broke(self, name: str, reason: str) -> None:
        """A batcher failed for good; nothing short of a fresh process serves that model again."""
        self.report_fault(f"the batcher of model {name!r} failed: {reason}")

    def report_fault(self, fault: str) -> None:
        """A fault of the server's own that leaves it unable to serve: the first one is kept and told
        (the server drains and exits for its supervisor to start a fresh process)."""
        if not self.fault:
            self.fault = fault
            self.on_fault(fault)

    async def stop(self, grace_period_s: float) -> None:
        """Finish queued work of every version within the grace period, then release them."""
        versions = [
            served
            for entry in self._entries.values()
            for served in (
                *entry.serving.values(),
                *entry.leased.values(),
                *entry.draining,
                *entry.loading.values(),
            )
        ]
        await asyncio.gather(*(self.loader.release(served, grace_period_s) for served in versions))
        self.loader.shutdown()

    def not_serving_reason(self) -> str:
        """Once loading has finished: why no model serves (the repository holds none, or none
        loaded), naming the folder or the models' errors; "" when one serves."""
        if any(entry.route is not None for entry in self._entries.values()):
            return ""
        if self.unservable:
            return self.unservable
        errors = "; ".join(
            f"{entry.name}: {entry.problems() or entry.state()}" for entry in self._sorted_entries()
        )
        return f"no model of the repository {self._config.model_repository} could be loaded: {errors}"

    # -- lookups ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._entries)

    def _sorted_entries(self) -> list[ModelEntry]:
        return [self._entries[name] for name in self.names()]

    def all(self) -> list[ServedModel]:
        """Each model as a request naming no version finds it: its serving version, else a
        placeholder saying why none serves."""
        return [self._head(entry) for entry in self._sorted_entries()]

    def served_versions(self, name: str) -> list[ServedModel]:
        """The versions of ``name`` that serve, ascending (none for an unknown name)."""
        entry = self._entries.get(name)
        return [entry.serving[version] for version in sorted(entry.serving)] if entry else []

    def served_version_numbers(self) -> dict[str, list[int]]:
        """Every model's serving versions: what a supervisor publishes for its node."""
        return {entry.name: sorted(entry.serving) for entry in self._sorted_entries()}

    def metrics_of(self, name: str) -> ModelMetrics | None:
        """The series a request naming ``name`` counts in; None for a name of no model here."""
        entry = self._entries.get(name)
        return entry.metrics if entry is not None else None

    def known(self, name: str) -> ModelEntry:
        """The entry of ``name``; INVALID_ARGUMENT for a name that is not one, NOT_FOUND for one
        of no model here."""
        try:
            validate_model_name(name)  # a folder of the repository may have a name that is none
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        entry = self._entries.get(name)
        if entry is not None:
            return entry
        raise ModelNotFound(  # Triton's first words, which clients written against Triton look for
            f"Request for unknown model: {name!r} is not served here; available models: "
            f"{', '.join(self.names()) or 'none'}"
        )

    def get(self, name: str) -> ServedModel:
        """The model called ``name`` as ``all`` lists it; INVALID_ARGUMENT or NOT_FOUND otherwise."""
        return self._head(self.known(name))

    def ready(self, name: str, version: int = 0, *, while_draining: bool = False) -> ServedModel:
        """The version of ``name`` that serves ``version`` (0: the highest serving); the right
        error otherwise. ``while_draining``: also while the server drains (for reads about the
        model, not requests)."""
        entry = self._entries.get(name)
        if entry is not None and not self.fault and not self.draining:
            served = entry.serving.get(version) if version else entry.route
            if served is not None:
                return served
            served = entry.leased.get(version) if version else None
            if served is not None:
                entry.lease_until[version] = time.monotonic() + self._config.version_lease_s
                return served
        return self._refuse(name, version, while_draining)

    def _refuse(self, name: str, version: int, while_draining: bool) -> ServedModel:
        entry = self.known(name)
        if self.fault and not while_draining:
            raise ModelUnavailable(
                f"model {name!r}: the server is stopping after an unrecoverable fault ({self.fault}); "
                "send the request elsewhere"
            )
        if self.draining and not while_draining:
            raise ModelUnavailable(f"model {name!r}: the server is draining; send the request elsewhere")
        served = entry.serving.get(version) if version else entry.route
        if served is not None:  # while draining
            return served
        if entry.swapping:
            raise ModelSwapping(
                f"model {name!r} is switching versions and holds none while the new one loads "
                "(--version-swap unload-first); retry shortly"
            )
        if entry.route is None:
            if entry.loading:
                raise ModelUnavailable(f"model {name!r} is still loading; retry shortly")
            if entry.unloaded:
                raise ModelNotFound(
                    f"model {name!r} is unloaded on this server; available models: "
                    f"{', '.join(n for n, e in self._entries.items() if e.route) or 'none'}"
                )
            raise ModelUnavailable(f"model {name!r} failed to load: {entry.problems()}")
        if version in entry.loading:
            raise ModelUnavailable(f"model {name!r} version {version} is still loading; retry shortly")
        if version in entry.available and self.on_version_wanted(name, version):
            raise ModelUnavailable(
                f"model {name!r} version {version} is loading for the job that names it (its policy serves "
                f"{', '.join(map(str, sorted(entry.serving)))}); retry shortly"
            )
        served_text = ", ".join(map(str, sorted(entry.serving)))
        if version in entry.gone:
            raise ModelNotFound(
                f"model {name!r} version {version} is no longer served: {entry.gone[version]}; this server "
                f"serves version {served_text}"
            )
        raise ModelNotFound(
            f"model {name!r} version {version} is not served; this server serves version "
            f"{served_text} (versions in the repository: {', '.join(map(str, entry.available))})"
        )

    def _head(self, entry: ModelEntry) -> ServedModel:
        if entry.route is not None:
            return entry.route
        if entry.loading:
            return entry.loading[max(entry.loading)]
        return ServedModel(
            name=entry.name, source=None, state=entry.state(), error=entry.problems(), metrics=entry.metrics
        )

    def info(self, served: ServedModel) -> ModelInfo:
        source, model = served.source, served.model
        entry = self._entries.get(served.name)
        return ModelInfo(
            name=served.name,
            version=served.version,
            platform=model.platform if model else (source.backend if source else ""),
            state=served.state,
            error=entry.problems() if entry is not None else served.error,
            inputs=list(model.inputs) if model else [],
            outputs=list(model.outputs) if model else [],
            max_batch_size=source.config.max_batch_size if source else 0,
            max_queue_delay_s=source.config.dynamic_batching.max_queue_delay_s if source else 0.0,
            device=self._config.device,
            available_versions=list(entry.available if entry is not None else ()),
            served_versions=sorted(entry.serving) if entry is not None else [],
        )

    @property
    def repository(self) -> Path:
        return self._config.model_repository

    def entries(self) -> list[ModelEntry]:
        """Every model's entry, by name (for ``core.model_control``)."""
        return self._sorted_entries()


def _queued_rows(entry: ModelEntry) -> int:
    """Rows waiting for a batch over every version of the model (the queue gauge's value)."""
    versions = (*entry.serving.values(), *entry.leased.values(), *entry.draining)
    return sum(served.batcher.queued_rows for served in versions if served.batcher is not None)
