"""Old versions kept for the jobs that pinned them: leases, their bounds, and loads on demand.

A Spark job pins the version serving when its UDF is built and names it in every request
(``version_consistency="job"``). When a model's policy stops serving that version, ``ModelControl``
hands it here instead of unloading it: it is leased, answering only the requests that name it,
until ``--version-lease-s`` after the last of them (and at least that long after its replacement,
so that tasks reaching another node's server later find it too). A request naming a version of
the repository this process does not hold (a server restarted after the publish) loads it,
leased. At most ``--max-leased-versions`` per model and ``--max-leased-version-bytes`` of model
files are leased at once; a version past a bound is unloaded, and ``ModelEntry.gone`` says why to
the requests that name it. With ``--version-swap unload-first`` nothing is leased.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import model_source
from udfserve.services.model_server.core.model_table import ModelEntry, ModelTable
from udfserve.services.model_server.core.served_model import ServedModel

logger = logging.getLogger(__name__)

Retire = Callable[[ModelEntry, list[ServedModel], str], Awaitable[None]]
"""``ModelControl._retire``: stop routing to versions, drain them, release them, saying why."""


class VersionLeases:
    """The leased versions of every model of one server: which, until when, and what they weigh."""

    def __init__(self, models: ModelTable, lock: asyncio.Lock, retire: Retire) -> None:
        self._models = models
        self._config = models.config
        self._lock = lock
        """``ModelControl``'s: a lease's load or lapse is a change like any other, one at a time."""
        self._retire = retire
        self._bytes: dict[tuple[str, int], int] = {}
        """The files' bytes of each leased version, by (model, version)."""
        self._wanted: asyncio.Task[None] | None = None
        """The load of a version a request named (``version_wanted``), one at a time."""

    def forget(self, name: str, version: int) -> None:
        """A version left the process: it weighs nothing any more."""
        self._bytes.pop((name, version), None)

    def serve_again(self, entry: ModelEntry, wanted: dict[int, ModelSource], changed: bool) -> None:
        """A leased version the policy serves again (a rollback) serves again, unless its files or
        config changed (it then loads anew, and the leased copy stays for the jobs that pinned it)."""
        for version in [v for v in entry.leased if v in wanted and v not in entry.serving]:
            if changed or source_of(entry.leased[version]).fingerprint != wanted[version].fingerprint:
                continue
            entry.serving[version] = entry.leased.pop(version)
            entry.lease_until.pop(version, None)
            entry.gone.pop(version, None)
            logger.info("model %r version %d: served again (it was leased)", entry.name, version)
        entry.reroute()

    async def lease(self, entry: ModelEntry, versions: list[ServedModel]) -> list[tuple[ServedModel, str]]:
        """Keep ``versions`` (no longer wanted) loaded for the jobs that pinned them, the newest first,
        within the bounds; from then on they answer only requests that name them. Returns the ones
        not kept, each with why (for the refusal of a request that names it later)."""
        config = self._config
        policy = "its version policy no longer serves it"
        if not config.version_lease_s or config.version_swap == "unload-first":
            return [(served, policy) for served in versions]
        refused: list[tuple[ServedModel, str]] = []
        for served in sorted(versions, key=lambda s: s.version, reverse=True):
            size = await asyncio.to_thread(_files_bytes, source_of(served).path)
            held = sum(self._bytes.values())
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
            self._bytes[(entry.name, served.version)] = size
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
        if self._wanted is not None and not self._wanted.done():
            return False  # one at a time: a burst of old versions named by clients loads nothing more
        entry.loading[version] = ServedModel(name=name, source=None, metrics=entry.metrics)
        self._wanted = asyncio.get_running_loop().create_task(self._load_leased(entry, version))
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
                if sum(self._bytes.values()) + size > config.max_leased_version_bytes:
                    bound = config.max_leased_version_bytes
                    entry.gone[version] = f"its {size} bytes would pass --max-leased-version-bytes {bound}"
                    return
                served = await self._models.loader.load(source, entry.metrics)
                if served.state != "ready":
                    entry.gone[version] = f"it failed to load: {served.error}"
                    return
                entry.leased[version] = served
                entry.lease_until[version] = time.monotonic() + config.version_lease_s
                self._bytes[(entry.name, version)] = size
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


def source_of(served: ServedModel) -> ModelSource:
    assert served.source is not None
    return served.source
