"""The models of one server process: their load state, their batchers, and lookups.

Every model is loaded exactly once per process, in a background thread, so the server
listens (and answers UNAVAILABLE for that model) while it loads. A model that fails to load
stays listed as failed with its error; the others serve.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from services.model_server.config import ServerConfig
from services.model_server.core.batching import DynamicBatcher
from services.model_server.core.cpu_parallel import CallsInFlight, CoreParallelPredict
from services.model_server.errors import ModelNotFound, ModelUnavailable
from services.model_server.observability.metrics import ModelMetrics, ServerMetrics
from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.model_config import validate_model_name
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import load_model, no_servable_model, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec

logger = logging.getLogger(__name__)

ModelState = Literal["loading", "ready", "failed"]


class ModelInfo(BaseModel):
    """What the server tells about a model, over gRPC and HTTP alike."""

    name: str
    version: int
    platform: str
    state: ModelState
    error: str = ""
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    max_batch_size: int = 0
    max_queue_delay_s: float = 0.0
    device: str
    available_versions: list[int] = []


@dataclass
class ServedModel:
    """One model of the repository as this process holds it."""

    name: str
    source: ModelSource | None
    state: ModelState = "loading"
    error: str = ""
    model: LoadedModel | None = None
    batcher: DynamicBatcher | None = None
    executor: ThreadPoolExecutor | None = field(default=None, repr=False)
    metrics: ModelMetrics | None = field(default=None, repr=False)
    """The model's labelled series, resolved once when the repository is scanned: requests
    refused while it loads, after it failed or for a version it does not serve count for it."""


def cpu_parts(config: ServerConfig) -> int:
    """Into how many concurrent parts a large backend call is cut: one per usable core on a CPU
    device (``cpu``, ``sim:N``), none on a GPU or when ``cpu_parallel_min_rows`` is 0."""
    if config.device.startswith("gpu") or config.cpu_parallel_min_rows == 0:
        return 1
    return len(os.sched_getaffinity(0))


class ModelTable:
    """Lookups and lifecycle of the models; the gRPC and HTTP layers only read it."""

    def __init__(self, config: ServerConfig, metrics: ServerMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._models: dict[str, ServedModel] = {}
        self._unservable = ""
        """Why the repository yields no model to load (empty, a model's own folder, ...)."""
        self.loading_done = asyncio.Event()
        self.draining = False
        self.on_state_change: Callable[[ServedModel], None] = lambda _model: None
        self.fault = ""
        """Why the process can no longer serve (a batcher broke for good); "" while it can."""
        self.on_fault: Callable[[str], None] = lambda _reason: None
        """Called once, with ``fault``, when it is set: the server must stop and be replaced."""
        self._parts = cpu_parts(config)
        self._calls_in_flight = CallsInFlight()
        self._parts_executor = (
            ThreadPoolExecutor(max_workers=self._parts - 1, thread_name_prefix="infer-part")
            if self._parts > 1
            else None
        )

    # -- loading ---------------------------------------------------------------------------
    def scan(self) -> None:
        """Read the repository layout; models that cannot be served are marked failed now."""
        scan = scan_repository(
            self._config.model_repository,
            self._config.models,
            trust_savedmodels=self._config.trust_savedmodels,
        )
        for source in scan.sources:
            self._models[source.name] = ServedModel(
                name=source.name, source=source, metrics=self._metrics.for_model(source.name)
            )
        for name, message in scan.failures.items():
            logger.error("model %r cannot be served: %s", name, message)
            self._models[name] = ServedModel(
                name=name, source=None, state="failed", error=message, metrics=self._metrics.for_model(name)
            )
        for served in self._models.values():
            self._metrics.model_ready.labels(model=served.name, version=str(self._version(served))).set(0)
        if not scan.sources:
            self._unservable = no_servable_model(self._config.model_repository, scan, self._config.models)

    async def load_all(self) -> None:
        """Load every scanned model once, one after the other, off the event loop."""
        try:
            for served in list(self._models.values()):
                if served.source is None:
                    self.on_state_change(served)
                    continue
                await self._load(served, served.source)
        finally:
            self.loading_done.set()

    async def _load(self, served: ServedModel, source: ModelSource) -> None:
        started = time.perf_counter()
        try:
            model = await asyncio.to_thread(load_model, source)
        except ModelLoadError as exc:
            served.state, served.error = "failed", str(exc)
            logger.error("%s", exc)
        except Exception as exc:  # a bug or a framework fault: report it against this model only
            served.state = "failed"
            served.error = f"model {source.name!r}: loading {source.path} failed: {type(exc).__name__}: {exc}"
            logger.exception("unexpected failure loading model %r", source.name)
        else:
            self._metrics.model_loads.labels(model=source.name).inc()
            self._metrics.model_load_duration.labels(model=source.name).set(time.perf_counter() - started)
            served.model = model
            served.executor = ThreadPoolExecutor(
                max_workers=self._config.inference_threads, thread_name_prefix=f"infer-{source.name}"
            )
            predict = model.predict
            if self._parts_executor is not None:
                predict = CoreParallelPredict(
                    predict,
                    parts=self._parts,
                    min_rows_per_part=self._config.cpu_parallel_min_rows,
                    executor=self._parts_executor,
                    calls=self._calls_in_flight,
                    queued_rows=lambda: served.batcher.queued_rows if served.batcher is not None else 0,
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
                on_broken=functools.partial(self._batcher_broke, source.name),
            )
            batcher.start()
            served.batcher = batcher
            self._metrics.track_queue(source.name, lambda: batcher.queued_rows)
            served.state = "ready"
            self._metrics.model_ready.labels(model=source.name, version=str(source.version)).set(1)
            logger.info(
                "model %r version %d ready on %s in %.2f s",
                source.name,
                source.version,
                self._config.device,
                time.perf_counter() - started,
            )
        self.on_state_change(served)

    def _batcher_broke(self, name: str, reason: str) -> None:
        """A batcher failed for good; nothing short of a fresh process serves that model again."""
        if not self.fault:
            self.fault = f"the batcher of model {name!r} failed: {reason}"
            self.on_fault(self.fault)

    async def stop(self, grace_period_s: float) -> None:
        """Finish queued work of every model within the grace period, then release threads."""
        batchers = [m.batcher for m in self._models.values() if m.batcher is not None]
        await asyncio.gather(*(b.stop(grace_period_s) for b in batchers))
        for served in self._models.values():
            if served.executor is not None:
                served.executor.shutdown(wait=False, cancel_futures=True)
        if self._parts_executor is not None:
            self._parts_executor.shutdown(wait=False, cancel_futures=True)

    def not_serving_reason(self) -> str:
        """Once loading has finished: why no model serves (the repository holds none, or none
        loaded), naming the folder or the models' errors; "" when one serves."""
        if self._unservable:
            return self._unservable
        if any(served.state == "ready" for served in self._models.values()):
            return ""
        errors = "; ".join(f"{m.name}: {m.error}" for m in self.all() if m.state == "failed")
        return f"no model of the repository {self._config.model_repository} could be loaded: {errors}"

    # -- lookups ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._models)

    def all(self) -> list[ServedModel]:
        return [self._models[name] for name in self.names()]

    def metrics_of(self, name: str) -> ModelMetrics | None:
        """The series a request naming ``name`` counts in; None for a name of no model here."""
        served = self._models.get(name)
        return served.metrics if served is not None else None

    def get(self, name: str) -> ServedModel:
        """The model called ``name`` in any state; INVALID_ARGUMENT or NOT_FOUND otherwise."""
        served = self._models.get(name)
        if served is not None and served.model is not None:  # loaded: its name passed the checks
            return served
        try:
            validate_model_name(name)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        served = self._models.get(name)
        if served is None:
            raise ModelNotFound(
                f"model {name!r} is not served here; available models: {', '.join(self.names()) or 'none'}"
            )
        return served

    def ready(self, name: str, version: int = 0, *, while_draining: bool = False) -> ServedModel:
        """The model, ready to serve ``version`` (0: the served one); the right error otherwise.
        ``while_draining``: also while the server drains (for reads about the model, not requests)."""
        served = self.get(name)
        if self.fault and not while_draining:
            raise ModelUnavailable(
                f"model {name!r}: the server is stopping after an unrecoverable fault ({self.fault}); "
                "send the request elsewhere"
            )
        if self.draining and not while_draining:
            raise ModelUnavailable(f"model {name!r}: the server is draining; send the request elsewhere")
        if served.state == "loading":
            raise ModelUnavailable(f"model {name!r} is still loading; retry shortly")
        if served.state == "failed":
            raise ModelUnavailable(f"model {name!r} failed to load: {served.error}")
        assert served.source is not None and served.model is not None
        if version and version != served.source.version:
            raise ModelNotFound(
                f"model {name!r} version {version} is not served; this server serves version "
                f"{served.source.version} (versions in the repository: "
                f"{', '.join(map(str, served.source.available_versions))})"
            )
        return served

    def info(self, served: ServedModel) -> ModelInfo:
        source, model = served.source, served.model
        return ModelInfo(
            name=served.name,
            version=self._version(served),
            platform=model.platform if model else (source.config.backend if source else ""),
            state=served.state,
            error=served.error,
            inputs=list(model.inputs) if model else [],
            outputs=list(model.outputs) if model else [],
            max_batch_size=source.config.max_batch_size if source else 0,
            max_queue_delay_s=source.config.dynamic_batching.max_queue_delay_s if source else 0.0,
            device=self._config.device,
            available_versions=list(source.available_versions) if source else [],
        )

    @staticmethod
    def _version(served: ServedModel) -> int:
        return served.source.version if served.source else 0

    @property
    def repository(self) -> Path:
        return self._config.model_repository
