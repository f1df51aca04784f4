"""How the versions a server holds change: at start, by watching the repository, or on a call.

One rule for every way (``--model-control none|poll|explicit``): a model's wanted versions are
what its version policy serves of the version folders the repository holds. A wanted version
that is new, or whose files or config.yaml changed, loads beside the ones serving (warmed up
before it takes a request); once it serves, every version no longer wanted (or replaced) stops
taking requests and drains its queued and running ones, then unloads. A version that fails to
load changes nothing that serves: the versions serving before keep serving, and the failure is
in the log, the model's metadata and health, and ``udfserve_model_load_failures_total``.
``--version-swap unload-first`` drains the old versions before loading, for devices that cannot
hold both; requests naming no version are then refused RESOURCE_EXHAUSTED until the new one
serves (clients back off and resend).

A version the policy stops serving is leased rather than unloaded at once, for the jobs that pinned
it (``version_leases``).

Changes are applied one at a time (one lock), and a bounded number of calls may wait for it:
a storm of load and unload calls is refused RESOURCE_EXHAUSTED beyond that, never queued
without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.model_config import ModelConfig, validate_model_name
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import (
    ModelVersions,
    RepositoryScan,
    no_servable_model,
    read_model,
    resolve_model_dir,
    scan_repository,
)
from udfserve.services.model_server.core.model_table import ModelEntry, ModelTable
from udfserve.services.model_server.core.repository_index import IndexEntry, repository_index
from udfserve.services.model_server.core.served_model import ServedModel
from udfserve.services.model_server.core.server_paths import without_server_paths
from udfserve.services.model_server.core.version_leases import VersionLeases, source_of
from udfserve.services.model_server.errors import (
    ModelControlRefused,
    ModelLoadFailed,
    ModelNotFound,
    QueueFull,
)

logger = logging.getLogger(__name__)

MAX_WAITING_CONTROL_CALLS = 16
"""Load and unload calls that may wait while another change is applied; more are refused."""
GONE_REMEMBERED = 8
"""Unloaded versions per model whose reason a refusal can still give."""


class ModelControl:
    """Applies the repository's models to the table: at start, on each poll, or on a call."""

    def __init__(self, models: ModelTable) -> None:
        self._models = models
        self._config = models.config
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._seen: dict[str, tuple[object, float]] = {}
        """Poll: each model's last fingerprint and when it was first seen so (for the settle time)."""
        self._applied: dict[str, object] = {}
        """Each model's fingerprint last applied, failed or not: a poll retries only a change."""
        self._initial: RepositoryScan | None = None
        self.leases = VersionLeases(models, self._lock, self._retire)
        models.on_version_wanted = self.leases.version_wanted

    @property
    def mode(self) -> str:
        return self._config.model_control

    # -- start -------------------------------------------------------------------------------
    def scan_initial(self) -> None:
        """Read the repository's layout before the server listens (a repository that is not a
        folder refuses the start: ``OSError``); models that cannot be served are listed failed."""
        models = self._models
        scan = scan_repository(
            self._config.model_repository,
            self._config.models,
            trust_savedmodels=self._config.trust_savedmodels,
        )
        for name, message in scan.failures.items():
            self._fail_model(name, message)
            self._applied[name] = ("failed", message)
        for found in scan.models:
            models.entry(found.name)
        if not scan.models:
            models.unservable = no_servable_model(self._config.model_repository, scan, self._config.models)
        self._initial = scan

    async def load_initial(self) -> None:
        """Load every model the start's scan found, one after the other."""
        scan, self._initial = self._initial, None
        try:
            for found in scan.models if scan is not None else ():
                async with self._lock:
                    await self._apply(found)
                self._applied[found.name] = _fingerprint(found)
        finally:
            self._models.loading_done.set()

    # -- poll --------------------------------------------------------------------------------
    async def poll_forever(self) -> None:
        """``--model-control poll``: scan the repository every ``repository_poll_s`` and apply
        each change once it stayed the same for ``repository_settle_s``."""
        while True:
            await asyncio.sleep(self._config.repository_poll_s)
            try:
                await self.poll_once()
            except Exception:  # a fault of ours: logged, and the next poll tries again
                logger.exception("polling the model repository %s failed", self._config.model_repository)

    async def poll_once(self) -> None:
        config = self._config
        try:
            scan = await asyncio.to_thread(
                scan_repository,
                config.model_repository,
                config.models,
                trust_savedmodels=config.trust_savedmodels,
            )
        except OSError as exc:
            logger.warning(
                "cannot scan the model repository %s: %s; keeping every model", config.model_repository, exc
            )
            return
        now = time.monotonic()
        current: dict[str, object] = {found.name: _fingerprint(found) for found in scan.models}
        current |= {name: ("failed", message) for name, message in scan.failures.items()}
        for name in self._applied.keys() - current.keys():
            current[name] = ("removed",)
        for name, fingerprint in current.items():
            if self._applied.get(name) == fingerprint:
                self._seen.pop(name, None)
                continue
            seen = self._seen.get(name)
            if seen is None or seen[0] != fingerprint:
                self._seen[name] = (fingerprint, now)  # changed since the last scan: wait for it to settle
                continue
            if now - seen[1] < config.repository_settle_s:
                continue
            del self._seen[name]
            self._applied[name] = fingerprint
            async with self._lock:
                if name in scan.failures:
                    self._fail_model(name, scan.failures[name])
                elif fingerprint == ("removed",):
                    await self._unload(name, "it left the repository")
                else:
                    await self._apply(next(found for found in scan.models if found.name == name))

    # -- explicit ----------------------------------------------------------------------------
    async def load(self, name: str, config: ModelConfig | None = None, *, reload: bool = False) -> None:
        """Load ``name`` from the repository: the versions its policy serves (``config`` replaces
        its config.yaml when given) that are new or changed, or all of them with ``reload``,
        beside what serves, then drain what they replace. Returns once they serve; raises
        ``ModelLoadFailed`` when one could not load (what served keeps serving)."""
        self._check_control_call(name)
        async with self._turn():
            try:
                found = await asyncio.to_thread(self._read_for_load, name, config)
            except OSError as exc:
                logger.error("model %r: cannot read the model repository: %s", name, exc)
                reason = without_server_paths(str(exc), self._config.model_repository)
                raise ModelLoadFailed(f"model {name!r}: cannot read the model repository: {reason}") from None
            await self._apply(found, reload=reload)
            self._applied[name] = _fingerprint(found)
            entry = self._models.entry(name)
            failed = [entry.failed_versions[v] for v in sorted(entry.failed_versions)]
            if failed:
                serving = sorted(entry.serving)
                keeps = f"; version(s) {serving} keep serving" if serving else ""
                raise ModelLoadFailed(f"model {name!r}: {'; '.join(failed)}{keeps}")

    def _read_for_load(self, name: str, config: ModelConfig | None) -> ModelVersions:
        """The model a load call names, read from the repository (off the loop): with its
        config.yaml, or with ``config`` in its place (which also serves a model whose config.yaml
        does not parse). NOT_FOUND without a folder, FAILED_PRECONDITION for a folder that cannot
        be served, INVALID_ARGUMENT for a given config that cannot serve it."""
        root = self._config.model_repository
        if not (root / name).is_dir():
            raise ModelNotFound(
                f"model {name!r} is not in the model repository; expected a folder <repo>/{name}"
            )
        if config is None:
            scan = scan_repository(root, [name], trust_savedmodels=self._config.trust_savedmodels)
            if name in scan.failures:
                reason = without_server_paths(scan.failures[name], root)
                raise ModelLoadFailed(f"model {name!r} cannot be loaded: {reason}")
            return scan.models[0]
        try:
            resolve_model_dir(root, name)
        except ValueError as exc:
            raise ModelLoadFailed(f"model {name!r} cannot be loaded: {exc}") from None
        try:
            return read_model(root, name, config, trust_savedmodels=self._config.trust_savedmodels)
        except ValueError as exc:
            raise InvalidInput(f"model {name!r}: {exc}") from None

    async def unload(self, name: str) -> None:
        """Stop routing requests to every version of ``name``, let them drain, release them."""
        self._check_control_call(name)
        async with self._turn():
            if name not in self._models.names():
                loaded = ", ".join(self._models.names()) or "none"
                raise ModelNotFound(f"model {name!r} is not loaded here; loaded models: {loaded}")
            await self._unload(name, "an unload call")

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model of the repository and every model the server holds, with its versions'
        states (Triton's ``RepositoryIndex``)."""
        return repository_index(self._models, ready_only)

    def _check_control_call(self, name: str) -> None:
        if self.mode != "explicit":
            raise ModelControlRefused(
                f"model control is {self.mode!r}: load and unload calls need a server started with "
                "--model-control explicit"
            )
        try:
            validate_model_name(name)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """The lock, for at most ``MAX_WAITING_CONTROL_CALLS`` callers waiting at once."""
        if self._lock.locked() and self._waiting >= MAX_WAITING_CONTROL_CALLS:
            raise QueueFull(
                f"{self._waiting} model control calls are waiting for the one being applied; "
                "retry once it finished"
            )
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    # -- applying ----------------------------------------------------------------------------
    def _fail_model(self, name: str, message: str) -> None:
        """The model's folder cannot be served: listed with why; versions serving keep serving."""
        entry = self._models.entry(name)
        shown = without_server_paths(message, self._config.model_repository)  # the log keeps the paths
        if entry.error != shown:
            logger.error("model %r cannot be served: %s", name, message)
            self._models.metrics.version_load_failed(name, 0)
        entry.error = shown
        self._models.on_state_change(name)

    async def _apply(self, found: ModelVersions, *, reload: bool = False) -> None:
        models = self._models
        entry = models.entry(found.name)
        entry.error, entry.unloaded, entry.available = "", False, found.available
        config_changed = (
            entry.config_fingerprint is not None and entry.config_fingerprint != found.config_fingerprint
        )
        wanted = {source.version: source for source in found.sources}
        self.leases.serve_again(entry, wanted, reload or config_changed)
        to_load = [
            source
            for version, source in wanted.items()
            if reload
            or config_changed
            or version not in entry.serving
            or source_of(entry.serving[version]).fingerprint != source.fingerprint
        ]
        entry.failed_versions = {
            v: e
            for v, e in entry.failed_versions.items()
            if v in wanted and v not in {s.version for s in to_load}
        }
        previous: list[ModelSource] = []
        if to_load and self._config.version_swap == "unload-first" and entry.serving:
            entry.swapping = True
            entry.config_fingerprint = None
            previous = [source_of(served) for served in entry.serving.values()]
            await self._retire(entry, list(entry.serving.values()), "making room for the new version(s)")
        await self._load_versions(entry, to_load)
        if entry.swapping and not entry.serving and previous:
            logger.warning(
                "model %r: the new version(s) failed to load; loading the previous ones again", entry.name
            )
            await self._load_versions(entry, previous)
        entry.swapping = False
        if not entry.failed_versions:
            entry.config_fingerprint = found.config_fingerprint
        unwanted = [served for version, served in entry.serving.items() if version not in wanted]
        if unwanted and any(version in entry.serving for version in wanted):
            refused = await self.leases.lease(entry, unwanted)
            for why in dict.fromkeys(reason for _, reason in refused):
                await self._retire(entry, [served for served, reason in refused if reason == why], why)
        models.metrics.forget_versions(found.name, {*found.available, *entry.serving})
        models.on_state_change(found.name)

    async def _load_versions(self, entry: ModelEntry, sources: list[ModelSource]) -> None:
        """Load each of ``sources`` beside what serves; each serves once ready, replacing a version
        of the same number (which then drains)."""
        models, loader = self._models, self._models.loader
        for source in sources:
            entry.loading[source.version] = ServedModel(name=entry.name, source=source, metrics=entry.metrics)
            models.on_state_change(entry.name)
            try:
                served = await loader.load(source, entry.metrics)
            finally:  # never listed loading after its load ended, whatever ended it
                del entry.loading[source.version]
            if served.state != "ready":
                entry.failed_versions[source.version] = served.error
                serving = source.version in entry.serving  # the copy loaded before keeps serving
                models.metrics.version_load_failed(entry.name, source.version, still_serving=serving)
                models.on_state_change(entry.name)
                continue
            entry.failed_versions.pop(source.version, None)
            replaced = entry.serving.get(source.version)
            entry.serving[source.version] = served
            entry.reroute()
            models.on_state_change(entry.name)
            if replaced is not None:
                await self._retire(entry, [replaced], "replaced by a new load of the same version")

    async def _unload(self, name: str, why: str) -> None:
        entry = self._models.entry(name)
        entry.unloaded = True
        entry.failed_versions.clear()
        await self._retire(entry, [*entry.serving.values(), *entry.leased.values()], why)
        entry.config_fingerprint = None
        self._models.on_state_change(name)

    async def _retire(self, entry: ModelEntry, versions: list[ServedModel], why: str) -> None:
        """Stop routing to ``versions`` now, let them answer what they hold, then release them."""
        for served in versions:
            if entry.serving.get(served.version) is served:
                del entry.serving[served.version]
            if entry.leased.get(served.version) is served:
                del entry.leased[served.version]
                entry.lease_until.pop(served.version, None)
            entry.gone[served.version] = why
            while len(entry.gone) > GONE_REMEMBERED:
                del entry.gone[next(iter(entry.gone))]
            served.state = "draining"
            entry.draining.append(served)
            if served.version not in entry.serving:
                self._models.metrics.version_not_ready(entry.name, served.version)
            logger.info(
                "model %r version %d: unloading (%s); draining its requests", entry.name, served.version, why
            )
        entry.reroute()
        self._models.on_state_change(entry.name)
        await asyncio.gather(
            *(self._models.loader.release(s, self._config.version_drain_s) for s in versions)
        )
        for served in versions:
            self.leases.forget(entry.name, served.version)
            entry.draining.remove(served)
            serving = served.version in entry.serving  # a new copy of the same version serves
            self._models.metrics.version_unloaded(entry.name, served.version, still_serving=serving)
            logger.info("model %r version %d unloaded", entry.name, served.version)


def _fingerprint(found: ModelVersions) -> object:
    return (found.config_fingerprint, tuple((s.version, s.fingerprint) for s in found.sources))
