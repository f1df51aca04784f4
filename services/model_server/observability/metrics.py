"""Prometheus metrics of one model server process.

Each server process has its own registry and serves it on its own ``/metrics``; the node
supervisor lists every server as a scrape target, so no series is exported twice. Names
carry their unit (``_seconds``, ``_rows``, ``_total``). Labels stay bounded: ``model`` comes
from the repository (never from a request), ``code`` is a gRPC status name.

A request touches half a dozen series of its model. Looking a labelled child up costs several
times what updating it does, so each model's children are resolved once (``ModelMetrics``,
``ServerMetrics.for_model``) and kept for the life of the process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import Collector

import udfserve
from udfserve.services.model_server.core.job_context import JobContext, SparkApplications
from udfserve.services.model_server.observability.statistics import ModelStatistics

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_ROWS_BUCKETS = tuple(float(1 << i) for i in range(0, 17))
REQUESTS_PER_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


UNKNOWN_MODEL_LABEL = "<unknown>"
"""Metrics label of requests naming no model of the repository: labels never carry what a
client typed, so their number stays bounded."""


class ModelMetrics:
    """The series of one model, labelled once: what the request path and the batcher update."""

    def __init__(self, metrics: ServerMetrics, model: str) -> None:
        self.model = model
        self._requests = metrics.requests
        self._requests_by_code: dict[str, Counter] = {}
        self.request_duration = metrics.request_duration.labels(model=model)
        self.rows = metrics.rows.labels(model=model)
        self.in_flight = metrics.in_flight.labels(model=model)
        self.queue_wait = metrics.queue_wait.labels(model=model)
        self.room_wait = metrics.room_wait.labels(model=model)
        self.batch_rows = metrics.batch_rows.labels(model=model)
        self.batch_requests = metrics.batch_requests.labels(model=model)
        self.inference_duration = metrics.inference_duration.labels(model=model)
        self.statistics = ModelStatistics()
        """The model's figures for the KServe statistics extension (see ``statistics``)."""

    def requests(self, code: str) -> Counter:
        """The request counter of this model and status ``code`` (a gRPC status name)."""
        child = self._requests_by_code.get(code)
        if child is None:
            child = self._requests_by_code[code] = self._requests.labels(model=self.model, code=code)
        return child

    def observe_request(self, code: str, seconds: float, rows: int) -> None:
        self.requests(code).inc()
        self.request_duration.observe(seconds)
        if rows:
            self.rows.inc(rows)
        self.statistics.on_request(code == "OK", seconds, rows)

    def observe_batch(self, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)
        self.inference_duration.observe(seconds)
        if succeeded:
            self.statistics.on_call(rows, seconds)


class ServerMetrics:
    """The metrics of one server; also the batchers' observer (``BatchObserver``, and the optional
    ``AnswerObserver``, ``MemoryObserver`` and ``RoomObserver``)."""

    def __init__(
        self,
        device: str,
        device_uuid: str | None = None,
        max_tracked_apps: int = 64,
        slow_request_s: float = 1.0,
        event_loop: str = "asyncio",
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.applications = SparkApplications(registry, max_tracked_apps, slow_request_s, LATENCY_BUCKETS_S)
        self.requests = Counter(
            "udfserve_requests",
            "Predict requests (one per Arrow batch) by model and gRPC status code.",
            ["model", "code"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "udfserve_request_duration_seconds",
            "Time from receiving a request to having its answer encoded.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.rows = Counter("udfserve_rows", "Rows answered successfully.", ["model"], registry=registry)
        self.in_flight = Gauge(
            "udfserve_requests_in_flight",
            "Requests received and not yet answered.",
            ["model"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "udfserve_queue_wait_seconds",
            "Time a request waited in the batcher before its batch started.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.room_wait = Histogram(
            "udfserve_queue_room_wait_seconds",
            "Time a request waited for room in its model's queue (its application's share full) before "
            "it was queued, or refused after --room-wait-s: a request of a stream, or a unary KServe call.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.room_waiting_calls = Gauge(
            "udfserve_queue_room_waiting_calls",
            "Unary KServe inference calls waiting for room in their model's queue now (at most "
            "--room-wait-calls).",
            registry=registry,
        )
        self.batch_rows = Histogram(
            "udfserve_batch_size_rows",
            "Rows per backend call after dynamic batching.",
            ["model"],
            buckets=BATCH_ROWS_BUCKETS,
            registry=registry,
        )
        self.batch_requests = Histogram(
            "udfserve_batch_requests",
            "Requests merged into one backend call.",
            ["model"],
            buckets=REQUESTS_PER_BATCH_BUCKETS,
            registry=registry,
        )
        self.inference_duration = Histogram(
            "udfserve_inference_duration_seconds",
            "Time of one backend call on the device.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.backend_oom = Counter(
            "udfserve_backend_oom",
            "Backend calls that ran out of device memory (a single row among them fails its request).",
            ["model"],
            registry=registry,
        )
        self.oom_splits = Counter(
            "udfserve_oom_splits",
            "Backend calls that ran out of device memory and were split in halves and retried.",
            ["model"],
            registry=registry,
        )
        self.batch_limit = Gauge(
            "udfserve_batch_limit_rows",
            "Most rows one backend call runs now: max_batch_size, lower after running out of memory.",
            ["model"],
            registry=registry,
        )
        self.model_loads = Counter(
            "udfserve_model_loads",
            "Loads of a model version performed by this process (one per version is the goal; "
            "a reload of a changed version or config counts again).",
            ["model", "version"],
            registry=registry,
        )
        self.model_load_failures = Counter(
            "udfserve_model_load_failures",
            "Loads of a model version that failed (version 0: the model's config.yaml could not be "
            "read); the versions served before keep serving.",
            ["model", "version"],
            registry=registry,
        )
        self.model_unloads = Counter(
            "udfserve_model_unloads",
            "Versions unloaded after draining: replaced by a newer one, left out by the version "
            "policy, removed from the repository or unloaded by a call.",
            ["model", "version"],
            registry=registry,
        )
        self.model_load_duration = Gauge(
            "udfserve_model_load_duration_seconds",
            "Time the last load of the model version took, warm-up included.",
            ["model", "version"],
            registry=registry,
        )
        self.model_ready = Gauge(
            "udfserve_model_ready",
            "1 while the model version serves requests, 0 while it loads or drains, or after it failed.",
            ["model", "version"],
            registry=registry,
        )
        self._version_series: dict[str, set[str]] = {}
        """The versions labelled per model, so the series of versions gone are removed."""
        self.streams_active = Gauge("udfserve_streams_active", "Open Predict streams.", registry=registry)
        self.streams_paused = Gauge(
            "udfserve_streams_paused",
            "Streams (both protocols) not read because they hold --max-stream-held-requests or "
            "--max-stream-held-bytes of requests whose answers are not yet written: their clients "
            "do not read answers as fast as they send.",
            registry=registry,
        )
        self.unary_held_bytes = Gauge(
            "udfserve_unary_held_bytes",
            "Bytes of unary KServe calls reserved for reading or read and not yet answered (bounded "
            "by --max-unary-held-bytes).",
            registry=registry,
        )
        self.unary_calls_waiting = Gauge(
            "udfserve_unary_calls_waiting",
            "Unary KServe calls waiting, unread, for room in --max-unary-held-bytes.",
            registry=registry,
        )
        self.shared_memory_requests = Counter(
            "udfserve_shared_memory_requests",
            "Predict requests whose batch was read from a shared-memory file of a client of this node.",
            registry=registry,
        )
        self.shared_memory_refusals = Counter(
            "udfserve_shared_memory_refusals",
            "Predict requests whose shared memory the server could not use (FAILED_PRECONDITION, "
            "shared_memory_refused); the client resends them inline.",
            registry=registry,
        )
        self.admin_refusals = Counter(
            "udfserve_admin_refusals",
            "HTTP admin requests answered 429: their client asked more often than --admin-requests-per-s.",
            registry=registry,
        )
        self.metrics_renders = Counter(
            "udfserve_metrics_renders",
            "Renders of this /metrics page (this one included); scrapes that arrive together share one.",
            registry=registry,
        )
        self.queued_rows = Gauge(
            "udfserve_queued_rows",
            "Rows waiting in the model's batcher.",
            ["model"],
            registry=registry,
        )
        info = Gauge(
            "udfserve_server_info",
            "Constant 1, labelled with what this process serves on.",
            ["device", "device_uuid", "version", "event_loop"],
            registry=registry,
        )
        info.labels(
            device=device, device_uuid=device_uuid or "", version=udfserve.__version__, event_loop=event_loop
        ).set(1)
        self.start_time = Gauge(
            "udfserve_server_start_time_seconds", "Unix time the process started.", registry=registry
        )
        self.start_time.set(time.time())
        self._models: dict[str, ModelMetrics] = {}

    def for_model(self, model: str) -> ModelMetrics:
        """The series of a served ``model``, labelled on first use and kept (models come from the
        repository, so there are few)."""
        children = self._models.get(model)
        if children is None:
            children = self._models[model] = ModelMetrics(self, model)
        return children

    def register(self, collectors: Iterable[Collector]) -> None:
        """Add collectors of other parts of the process (GPU figures, for instance)."""
        for collector in collectors:
            self.registry.register(collector)

    # -- the lifecycle of model versions ----------------------------------------------------------
    def version_loaded(self, model: str, version: int, seconds: float) -> None:
        labels = self._version_labels(model, version)
        self.model_loads.labels(**labels).inc()
        self.model_load_duration.labels(**labels).set(seconds)
        self.model_ready.labels(**labels).set(1)

    def version_load_failed(self, model: str, version: int, *, still_serving: bool = False) -> None:
        labels = self._version_labels(model, version)
        self.model_load_failures.labels(**labels).inc()
        self.model_ready.labels(**labels).set(1 if still_serving else 0)

    def version_unloaded(self, model: str, version: int, *, still_serving: bool = False) -> None:
        labels = self._version_labels(model, version)
        self.model_unloads.labels(**labels).inc()
        self.model_ready.labels(**labels).set(1 if still_serving else 0)

    def version_not_ready(self, model: str, version: int) -> None:
        self.model_ready.labels(**self._version_labels(model, version)).set(0)

    def forget_versions(self, model: str, keep: Iterable[int]) -> None:
        """Remove the series of ``model``'s versions not in ``keep`` (those the repository and
        the process no longer hold), so that publishing versions for months grows no label set."""
        kept = {str(version) for version in keep}
        labelled = self._version_series.get(model, set())
        for version in labelled - kept:
            for metric in (
                self.model_loads,
                self.model_load_failures,
                self.model_unloads,
                self.model_load_duration,
                self.model_ready,
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(model, version)
        labelled &= kept

    def _version_labels(self, model: str, version: int) -> dict[str, str]:
        self._version_series.setdefault(model, set()).add(str(version))
        return {"model": model, "version": str(version)}

    def track_queue(self, model: str, queued_rows: Callable[[], int]) -> None:
        self.queued_rows.labels(model=model).set_function(queued_rows)

    def observe_request(self, model: str, code: str, seconds: float, rows: int) -> None:
        """Through the model's cached series when it has them (it is served); else (a request naming
        no served model) labelled here, so that such a label gets no series beyond these."""
        children = self._models.get(model)
        if children is not None:
            children.observe_request(code, seconds, rows)
            return
        self.requests.labels(model=model, code=code).inc()
        self.request_duration.labels(model=model).observe(seconds)
        if rows:
            self.rows.labels(model=model).inc(rows)

    def observe_answer(
        self,
        model_metrics: ModelMetrics | None,
        job: JobContext,
        request_id: int | str,
        code: str,
        seconds: float,
        rows: int,
    ) -> None:
        """Count one answered request of either protocol: for its model (``model_metrics`` None for
        a request naming no served model) and for the Spark application it names, if any."""
        if model_metrics is None:
            model = UNKNOWN_MODEL_LABEL
            self.observe_request(model, code, seconds, rows)
        else:
            model = model_metrics.model
            model_metrics.observe_request(code, seconds, rows)
        self.applications.observe(job, model, request_id, code, seconds, rows)

    # BatchObserver
    def on_queue_wait(self, model: str, seconds: float) -> None:
        self.for_model(model).queue_wait.observe(seconds)

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.for_model(model).observe_batch(rows, requests, seconds, succeeded)

    # RoomObserver
    def on_room_wait(self, model: str, seconds: float) -> None:
        self.for_model(model).room_wait.observe(seconds)

    # AnswerObserver
    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        self.for_model(model).statistics.on_answered(queue_s, compute_s)

    # MemoryObserver
    def on_out_of_memory(self, model: str, rows: int) -> None:
        self.backend_oom.labels(model=model).inc()
        if rows > 1:
            self.oom_splits.labels(model=model).inc()

    def on_batch_limit(self, model: str, rows: int) -> None:
        self.batch_limit.labels(model=model).set(rows)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
