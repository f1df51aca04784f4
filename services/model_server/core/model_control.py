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

A version the policy stops serving is not unloaded at once but leased: it keeps answering the
requests that name it (a Spark job pins the version it started with, so that every row of the job
comes from one version) until ``--version-lease-s`` after the last of them, and at least that long
after it was replaced, so that the tasks of a job that pinned it on another node find it too. At
most ``--max-leased-versions`` versions of a model, and ``--max-leased-version-bytes`` of model
files over all, are leased at once: a version replaced past those bounds is unloaded at once, and
a request naming it is refused NOT_FOUND saying so. With ``unload-first`` nothing is leased (the
device cannot hold two versions).

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
from dataclasses import dataclass
from pathlib import Path

from udfserve.log_text import clip
from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.model_config import ModelConfig, validate_model_name
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import (
    ModelVersions,
    RepositoryScan,
    model_source,
    no_servable_model,
    read_model,
    resolve_model_dir,
    scan_repository,
)
from udfserve.services.model_server.core.model_table import ModelEntry, ModelTable
from udfserve.services.model_server.core.served_model import ServedModel
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


@dataclass(frozen=True)
class IndexEntry:
    """One model of the repository, or held by the server, as Triton's repository index lists it."""

    name: str
    version: str
    state: str
    """READY, LOADING, UNLOADING or UNAVAILABLE."""
    reason: str


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
        self._leased_bytes: dict[tuple[str, int], int] = {}
        """The files' bytes of each leased version, by (model, version)."""
        self._wanted_task: asyncio.Task[None] | None = None
        """The load of a version a request named (``version_wanted``), one at a time."""
        models.on_version_wanted = self.version_wanted

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
                raise ModelLoadFailed(
                    f"model {name!r}: cannot read the model repository {self._config.model_repository}: {exc}"
                ) from None
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
                raise ModelLoadFailed(f"model {name!r} cannot be loaded: {scan.failures[name]}")
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
        listed: list[IndexEntry] = []
        names = set(self._models.names())
        with contextlib.suppress(OSError):
            root = self._config.model_repository
            names |= {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
        for name in sorted(names):
            try:
                validate_model_name(name)
            except ValueError:
                continue
            entry = self._models.entry(name) if name in self._models.names() else None
            if entry is None:
                if not ready_only:
                    listed.append(IndexEntry(name, "", "UNAVAILABLE", "unloaded"))
                continue
            for version in sorted(entry.serving):
                listed.append(IndexEntry(name, str(version), "READY", ""))
            for version in sorted(entry.leased):
                listed.append(
                    IndexEntry(name, str(version), "READY", "leased: serves the requests that name it")
                )
            if ready_only:
                continue
            for version in sorted(entry.loading):
                listed.append(IndexEntry(name, str(version), "LOADING", ""))
            for served in entry.draining:
                listed.append(IndexEntry(name, str(served.version), "UNLOADING", ""))
            for version, error in sorted(entry.failed_versions.items()):
                listed.append(IndexEntry(name, str(version), "UNAVAILABLE", clip(error, 1000)))
            if not (
                entry.serving or entry.leased or entry.loading or entry.draining or entry.failed_versions
            ):
                listed.append(
                    IndexEntry(name, "", "UNAVAILABLE", clip(entry.problems() or entry.state(), 1000))
                )
        return listed

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
        if entry.error != message:
            logger.error("model %r cannot be served: %s", name, message)
            self._models.metrics.version_load_failed(name, 0)
        entry.error = message
        self._models.on_state_change(name)

    async def _apply(self, found: ModelVersions, *, reload: bool = False) -> None:
        models = self._models
        entry = models.entry(found.name)
        entry.error, entry.unloaded, entry.available = "", False, found.available
        config_changed = (
            entry.config_fingerprint is not None and entry.config_fingerprint != found.config_fingerprint
        )
        wanted = {source.version: source for source in found.sources}
        self._serve_leased_again(entry, wanted, reload or config_changed)
        to_load = [
            source
            for version, source in wanted.items()
            if reload
            or config_changed
            or version not in entry.serving
            or _source_of(entry.serving[version]).fingerprint != source.fingerprint
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
            previous = [_source_of(served) for served in entry.serving.values()]
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
            refused = await self._lease(entry, unwanted)
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
            served = await loader.load(source, entry.metrics)
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
            self._leased_bytes.pop((entry.name, served.version), None)
            entry.draining.remove(served)
            serving = served.version in entry.serving  # a new copy of the same version serves
            self._models.metrics.version_unloaded(entry.name, served.version, still_serving=serving)
            logger.info("model %r version %d unloaded", entry.name, served.version)

    # -- leases ------------------------------------------------------------------------------
    def _serve_leased_again(self, entry: ModelEntry, wanted: dict[int, ModelSource], changed: bool) -> None:
        """A leased version the policy serves again (a rollback) serves again, unless its files or
        config changed (it then loads anew, and the leased copy stays for the jobs that pinned it)."""
        for version in [v for v in entry.leased if v in wanted and v not in entry.serving]:
            if changed or _source_of(entry.leased[version]).fingerprint != wanted[version].fingerprint:
                continue
            entry.serving[version] = entry.leased.pop(version)
            entry.lease_until.pop(version, None)
            entry.gone.pop(version, None)
            logger.info("model %r version %d: served again (it was leased)", entry.name, version)
        entry.reroute()

    async def _lease(self, entry: ModelEntry, versions: list[ServedModel]) -> list[tuple[ServedModel, str]]:
        """Keep ``versions`` (no longer wanted) loaded for the jobs that pinned them, the newest first,
        within the bounds; from then on they answer only requests that name them. Returns the ones
        not kept, each with why (for the refusal of a request that names it later)."""
        config = self._config
        policy = "its version policy no longer serves it"
        if not config.version_lease_s or config.version_swap == "unload-first":
            return [(served, policy) for served in versions]
        refused: list[tuple[ServedModel, str]] = []
        for served in sorted(versions, key=lambda s: s.version, reverse=True):
            size = await asyncio.to_thread(_files_bytes, _source_of(served).path)
            held = sum(self._leased_bytes.values())
            most, most_bytes = config.max_leased_versions, config.max_leased_version_bytes
            if len(entry.leased) >= most:
                why = (
                    f"{policy}, and {len(entry.leased)} older version(s) of it were kept for running jobs, "
                    f"the most this server keeps (--max-leased-versions {most})"
                )
                refused.append((served, why))
                continue
            if held + size > most_bytes:
                why = (
                    f"{policy}, and older versions of {held} bytes were kept for running jobs; its "
                    f"{size} bytes would pass --max-leased-version-bytes {most_bytes}"
                )
                refused.append((served, why))
                continue
            del entry.serving[served.version]
            entry.leased[served.version] = served
            entry.lease_until[served.version] = time.monotonic() + config.version_lease_s
            self._leased_bytes[(entry.name, served.version)] = size
            logger.info(
                "model %r version %d: no longer served to requests naming no version; kept for the jobs "
                "that name it until %.0f s after the last of them (--version-lease-s)",
                entry.name,
                served.version,
                config.version_lease_s,
            )
        entry.reroute()
        self._models.on_state_change(entry.name)
        return refused

    async def expire_leases_forever(self) -> None:
        """Unload each leased version once its lease lapsed: no request named it for
        ``version_lease_s``."""
        lease_s = self._config.version_lease_s
        check_s = min(5.0, max(0.2, lease_s / 4))
        while True:
            await asyncio.sleep(check_s)
            try:
                await self.expire_leases()
            except Exception:  # a fault of ours: logged, and the next check tries again
                logger.exception("expiring the leases of old model versions failed")

    async def expire_leases(self) -> None:
        now = time.monotonic()
        why = f"its lease lapsed: no request named it for {self._config.version_lease_s:g} s"
        async with self._lock:
            for entry in self._models.entries():
                lapsed = [s for v, s in entry.leased.items() if entry.lease_until.get(v, 0.0) <= now]
                if lapsed:
                    await self._retire(entry, lapsed, why)

    def version_wanted(self, name: str, version: int) -> bool:
        """A request named ``version`` of ``name``, present in the repository but not loaded here:
        load it leased, in the background, if the bounds allow (true), as a job that pinned it on
        another server, or before this process started, needs it; else false (the request is then
        refused NOT_FOUND, saying why)."""
        config = self._config
        entry = self._models.entry(name)
        if (
            not config.version_lease_s
            or config.version_swap == "unload-first"
            or version in entry.loading
            or len(entry.leased) >= config.max_leased_versions
        ):
            return version in entry.loading
        if self._wanted_task is not None and not self._wanted_task.done():
            return False  # one at a time: a burst of old versions named by clients loads nothing more
        entry.loading[version] = ServedModel(name=name, source=None, metrics=entry.metrics)
        self._wanted_task = asyncio.get_running_loop().create_task(self._load_leased(entry, version))
        return True

    async def _load_leased(self, entry: ModelEntry, version: int) -> None:
        config = self._config
        try:
            async with self._lock:
                try:
                    source = await asyncio.to_thread(
                        model_source,
                        config.model_repository,
                        entry.name,
                        version,
                        trust_savedmodels=config.trust_savedmodels,
                        any_present=True,
                    )
                    size = await asyncio.to_thread(_files_bytes, source.path)
                except (OSError, ModelLoadError) as exc:
                    entry.gone[version] = f"it cannot be loaded: {exc}"
                    return
                if sum(self._leased_bytes.values()) + size > config.max_leased_version_bytes:
                    bound = config.max_leased_version_bytes
                    entry.gone[version] = f"its {size} bytes would pass --max-leased-version-bytes {bound}"
                    return
                served = await self._models.loader.load(source, entry.metrics)
                if served.state != "ready":
                    entry.gone[version] = f"it failed to load: {served.error}"
                    return
                entry.leased[version] = served
                entry.lease_until[version] = time.monotonic() + config.version_lease_s
                self._leased_bytes[(entry.name, version)] = size
                entry.gone.pop(version, None)
                logger.info(
                    "model %r version %d: loaded for the jobs that name it, leased (--version-lease-s %.0f)",
                    entry.name,
                    version,
                    config.version_lease_s,
                )
        finally:
            entry.loading.pop(version, None)
            self._models.on_state_change(entry.name)

    def leased_versions(self) -> dict[str, list[int]]:
        """Every model's leased versions (for the admin app and the tests)."""
        return {entry.name: sorted(entry.leased) for entry in self._models.entries() if entry.leased}


def _files_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder``: what a leased version is charged."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def _source_of(served: ServedModel) -> ModelSource:
    assert served.source is not None
    return served.source


def _fingerprint(found: ModelVersions) -> object:
    return (found.config_fingerprint, tuple((s.version, s.fingerprint) for s in found.sources))
