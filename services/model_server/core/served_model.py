"""One version of a model as this process holds it, and how one is loaded and released.

A version is loaded off the event loop (the backend's load warms it up), gets its own batcher
and inference threads, and only then becomes ``ready``; the model table routes requests to it
from that moment. Releasing a version stops its batcher, which answers what it queued and runs
first (within the drain time), then lets go of its threads and its model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import ModelLoadError, raise_if_stopping
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import load_model
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services import log_context
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.core.cpu_parallel import CallsInFlight, CoreParallelPredict
from udfserve.services.model_server.core.server_paths import without_server_paths
from udfserve.services.model_server.observability.metrics import ModelMetrics, ServerMetrics

logger = logging.getLogger(__name__)

ModelState = Literal["loading", "ready", "draining", "failed", "unloaded"]
"""A version's state; a model's is its newest serving version's, else ``failed`` or ``unloaded``."""


class ModelInfo(BaseModel):
    """What the server tells about a model, over gRPC and HTTP alike."""

    name: str
    version: int
    """The version a request naming none gets (0 when no version serves)."""
    platform: str
    state: ModelState
    error: str = ""
    """Why the model, or a version of it the repository holds, does not serve ("" when all do)."""
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    max_batch_size: int = 0
    max_queue_delay_s: float = 0.0
    device: str
    available_versions: list[int] = []
    served_versions: list[int] = []


@dataclass
class ServedModel:
    """One version of a model as this process holds it (``source`` is None for the placeholder of
    a model that has no version to serve: its folder cannot be read, or it was unloaded)."""

    name: str
    source: ModelSource | None
    state: ModelState = "loading"
    error: str = ""
    model: LoadedModel | None = None
    batcher: DynamicBatcher | None = None
    executor: ThreadPoolExecutor | None = field(default=None, repr=False)
    metrics: ModelMetrics | None = field(default=None, repr=False)
    """The model's labelled series (shared by its versions)."""

    @property
    def version(self) -> int:
        return self.source.version if self.source is not None else 0


def _queued_rows(served: weakref.ref[ServedModel]) -> int:
    """Rows queued for a version, read through a weak reference: its predict must not keep it."""
    version = served()
    batcher = version.batcher if version is not None else None
    return batcher.queued_rows if batcher is not None else 0


def cpu_parts(config: ServerConfig) -> int:
    """Into how many concurrent parts a large backend call is cut: one per usable core on a CPU
    device (``cpu``, ``sim:N``), none on a GPU or when ``cpu_parallel_min_rows`` is 0."""
    if config.device.startswith("gpu") or config.cpu_parallel_min_rows == 0:
        return 1
    return len(os.sched_getaffinity(0))


class VersionLoader:
    """Loads versions into serving shape (model, threads, batcher) and releases them."""

    def __init__(
        self, config: ServerConfig, metrics: ServerMetrics, on_broken: Callable[[str, str], None]
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._on_broken = on_broken
        self._parts = cpu_parts(config)
        self._calls_in_flight = CallsInFlight()
        self._parts_executor = (
            ThreadPoolExecutor(max_workers=self._parts - 1, thread_name_prefix="infer-part")
            if self._parts > 1
            else None
        )

    async def load(self, source: ModelSource, metrics: ModelMetrics) -> ServedModel:
        """The version loaded, warmed up and batching (``ready``), or ``failed`` with why; never
        raises for a model that cannot load, whatever it raises (a panic of a framework's native
        code included, which is no ``Exception``): a load that raised past here would leave its
        model loading for good and stop the loads after it."""
        with log_context.about(model=source.name):  # its lines, those of its threads included
            return await self._load(source, metrics)

    async def _load(self, source: ModelSource, metrics: ModelMetrics) -> ServedModel:
        served = ServedModel(name=source.name, source=source, metrics=metrics)
        started = time.perf_counter()
        try:
            served.model = await asyncio.to_thread(load_model, source)
        except ModelLoadError as exc:
            served.state, served.error = "failed", str(exc)
        except BaseException as exc:  # a bug or a framework fault: reported against this version only
            raise_if_stopping(exc)
            served.state = "failed"
            served.error = (
                f"model {source.name!r} version {source.version}: loading {source.path} failed: "
                f"{type(exc).__name__}: {exc}"
            )
            logger.exception("unexpected failure loading model %r version %d", source.name, source.version)
        if served.state == "failed":
            logger.error("%s", served.error)
            served.error = without_server_paths(served.error, self._config.model_repository)
            return served
        self._start_batching(served)
        served.state = "ready"
        seconds = time.perf_counter() - started
        self._metrics.version_loaded(source.name, source.version, seconds)
        logger.info(
            "model %r version %d ready on %s in %.2f s",
            source.name,
            source.version,
            self._config.device,
            seconds,
        )
        return served

    def _start_batching(self, served: ServedModel) -> None:
        source, model = served.source, served.model
        assert source is not None and model is not None
        served.executor = ThreadPoolExecutor(
            max_workers=self._config.inference_threads,
            thread_name_prefix=f"infer-{source.name}-{source.version}",
        )
        predict = model.predict
        if self._parts_executor is not None:
            predict = CoreParallelPredict(
                predict,
                parts=self._parts,
                min_rows_per_part=self._config.cpu_parallel_min_rows,
                executor=self._parts_executor,
                calls=self._calls_in_flight,
                queued_rows=functools.partial(_queued_rows, weakref.ref(served)),
            )
        batcher = DynamicBatcher(
            source.name,
            predict,
            max_batch_size=source.config.max_batch_size,
            max_queue_rows=source.config.max_queue_rows,
            config=source.config.dynamic_batching,
            executor=served.executor,
            observer=self._metrics,
            max_concurrent_batches=self._config.inference_threads,
            max_flows=self._config.max_tracked_apps,
            on_broken=functools.partial(self._on_broken, source.name),
            call_bound_s=self._config.model_call_timeout_s,
        )
        batcher.start()
        served.batcher = batcher

    async def release(self, served: ServedModel, drain_s: float) -> None:
        """Answer what the version queued and runs (within ``drain_s``), then let it go. The
        caller stopped routing requests to it first, so nothing new reaches its batcher."""
        batcher, executor = served.batcher, served.executor
        if batcher is not None:
            await batcher.stop(drain_s)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        # The backend's memory goes with the last reference to the model, now: the batcher's
        # parts refer to each other (and its predict to the model), so a batcher left reachable,
        # or left to the garbage collector, kept a released version's memory for good.
        served.batcher = served.executor = served.model = None
        if batcher is not None:
            batcher.release_model()
        if served.state != "failed":
            served.state = "unloaded"

    def shutdown(self) -> None:
        if self._parts_executor is not None:
            self._parts_executor.shutdown(wait=False, cancel_futures=True)
