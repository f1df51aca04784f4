"""Which Spark job is using this server: the job context clients attach, and per-application totals.

The Spark client sends the application id and name, job group and description, stage,
partition and task attempt as gRPC metadata (``udfserve-spark-*`` keys) on every stream. They
are used for labelling only, never trusted: each value is bounded in length, must be printable,
and is dropped otherwise. Applications become metric labels (name and id, never stage or
partition), and at most ``max_tracked_apps`` of them are kept: when a new one arrives, the one
seen least recently is forgotten and its series removed, so label cardinality and memory stay
bounded whatever clients send. Stage, partition and attempt appear only in the structured logs
of slow or failed requests.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from udfserve.log_text import clip
from udfserve.spark_job_keys import MAX_VALUE_CHARS, METADATA_PREFIX, NUMERIC_KEYS
from udfserve.tracing import TRACEPARENT_KEY

TRACEPARENT_MAX_CHARS = 55
"""A version-00 ``traceparent`` is 55 characters; a longer value is dropped unread."""

logger = logging.getLogger(__name__)

LOG_LINES_PER_S = 10
"""Slow or failed requests logged per second at most: a flood of bad requests must not flood the logs."""


class LogBudget:
    """A token bucket: ``take()`` is true at most ``rate`` times per second on average."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._tokens = rate
        self._at = time.monotonic()
        self.suppressed = 0

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.suppressed += 1
        return False


@dataclass(frozen=True)
class JobContext:
    """The validated Spark context of one stream; empty strings where nothing valid was sent."""

    app_id: str = ""
    app_name: str = ""
    job_group: str = ""
    job_description: str = ""
    stage_id: str = ""
    partition_id: str = ""
    task_attempt: str = ""
    priority_class: str = ""
    """The class the application asks to be scheduled in; the server maps it to a weight, and one
    it does not list to its default class (``core.shares``)."""
    traceparent: str = ""
    """The W3C ``traceparent`` the stream came with (``observability.tracing`` reads it, and only
    when tracing is on); not a log field."""

    @property
    def has_application(self) -> bool:
        return bool(self.app_id)

    def log_fields(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v and k != "traceparent"}


def _valid(key: str, value: str) -> bool:
    if not value or len(value) > MAX_VALUE_CHARS[key] or not value.isprintable():
        return False
    return not (key in NUMERIC_KEYS and not value.isdigit())


def parse_job_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> JobContext:
    """Keep the known ``udfserve-spark-*`` keys whose values are short, printable text, and the
    W3C ``traceparent`` (read, and checked, only where tracing is on)."""
    values: dict[str, str] = {}
    for key, value in metadata or ():
        if key == TRACEPARENT_KEY and isinstance(value, str) and len(value) <= TRACEPARENT_MAX_CHARS:
            values["traceparent"] = value
            continue
        if not key.startswith(METADATA_PREFIX) or not isinstance(value, str):
            continue  # binary (-bin) metadata is never used
        name = key[len(METADATA_PREFIX) :]
        if name in MAX_VALUE_CHARS and _valid(name, value):
            values[name.replace("-", "_")] = value
    return JobContext(**values)


@dataclass
class ApplicationTotals:
    app_id: str
    app_name: str
    first_seen: float
    last_seen: float
    rows: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    models: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, object]:
        return {
            "app_id": self.app_id,
            "app_name": self.app_name,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "rows": self.rows,
            "requests": self.requests,
            "errors": self.errors,
            "mean_latency_s": self.seconds / self.requests if self.requests else 0.0,
            "models": sorted(self.models),
        }


class SparkApplications:
    """Per-application counters with a bounded number of applications (least recently seen out)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        max_tracked_apps: int,
        slow_request_s: float,
        buckets: tuple[float, ...],
    ) -> None:
        self.max_tracked_apps = max_tracked_apps
        self.slow_request_s = slow_request_s
        self._apps: OrderedDict[str, ApplicationTotals] = OrderedDict()
        self.evicted = 0
        self.rows = Counter(
            "udfserve_app_rows",
            "Rows answered, by Spark application (at most max_tracked_apps applications at a time).",
            ["app_name", "app_id"],
            registry=registry,
        )
        self.requests = Counter(
            "udfserve_app_requests",
            "Predict requests by Spark application and gRPC status code.",
            ["app_name", "app_id", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "udfserve_app_request_duration_seconds",
            "Request latency by Spark application.",
            ["app_name", "app_id"],
            buckets=buckets,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "udfserve_app_queue_wait_seconds",
            "Time a request's rows waited in a model's queue for their batch, by Spark application.",
            ["app_name", "app_id"],
            buckets=buckets,
            registry=registry,
        )
        self.weight = Gauge(
            "udfserve_app_weight",
            "The weight the queues give the application (its priority class's, as this server maps it): "
            "its share of a model's rows is its weight over the weights of the applications waiting.",
            ["app_name", "app_id", "priority_class"],
            registry=registry,
        )
        self._codes_seen: dict[str, set[str]] = {}
        self._classes_seen: dict[str, set[str]] = {}
        self._log_budget = LogBudget(LOG_LINES_PER_S)

    def observe_queue_wait(
        self, job: JobContext, scheduled_as: str, weight: int | None, seconds: float
    ) -> None:
        """One chunk of ``job``'s application waited ``seconds`` for its batch, scheduled in class
        ``scheduled_as`` with ``weight`` (None: in one queue in arrival order, no weight applied)."""
        if not job.has_application:
            return
        totals = self._tracked(job, time.time())
        labels = {"app_name": totals.app_name, "app_id": totals.app_id}
        self.queue_wait.labels(**labels).observe(seconds)
        if weight is None:
            return
        classes = self._classes_seen[job.app_id]
        if scheduled_as not in classes:
            for other in classes:
                self.weight.remove(totals.app_name, totals.app_id, other)
            classes.clear()
            classes.add(scheduled_as)
            self.weight.labels(priority_class=scheduled_as, **labels).set(weight)

    def observe(
        self, job: JobContext, model: str, batch_id: int | str, code: str, seconds: float, rows: int
    ) -> None:
        if (code != "OK" or seconds >= self.slow_request_s) and self._log_budget.take():
            logger.warning(
                "%s request: model=%s batch_id=%s code=%s seconds=%.3f %s",
                "failed" if code != "OK" else "slow",
                clip(model),
                clip(batch_id),
                code,
                seconds,
                " ".join(f"{k}={v!r}" for k, v in job.log_fields().items()),
                extra={"udfserve": {"model": model, "code": code, "seconds": seconds, **job.log_fields()}},
            )
        if not job.has_application:
            return
        now = time.time()
        totals = self._tracked(job, now)
        self._apps.move_to_end(job.app_id)
        totals.last_seen = now
        totals.requests += 1
        totals.seconds += seconds
        totals.models.add(model)
        labels = {"app_name": totals.app_name, "app_id": totals.app_id}
        self.requests.labels(code=code, **labels).inc()
        self._codes_seen[job.app_id].add(code)
        self.duration.labels(**labels).observe(seconds)
        if code == "OK":
            totals.rows += rows
            self.rows.labels(**labels).inc(rows)
        else:
            totals.errors += 1

    def _tracked(self, job: JobContext, now: float) -> ApplicationTotals:
        """The totals of ``job``'s application, tracked from now on if it was not."""
        totals = self._apps.get(job.app_id)
        return totals if totals is not None else self._admit(job, now)

    def _admit(self, job: JobContext, now: float) -> ApplicationTotals:
        while len(self._apps) >= self.max_tracked_apps:
            _, oldest = self._apps.popitem(last=False)
            self._forget_series(oldest)
            self.evicted += 1
        totals = ApplicationTotals(job.app_id, job.app_name, first_seen=now, last_seen=now)
        self._apps[job.app_id] = totals
        self._codes_seen[job.app_id] = set()
        self._classes_seen[job.app_id] = set()
        return totals

    def _forget_series(self, totals: ApplicationTotals) -> None:
        labels = (totals.app_name, totals.app_id)
        for code in self._codes_seen.pop(totals.app_id, set()):
            self.requests.remove(*labels, code)
        for scheduled_as in self._classes_seen.pop(totals.app_id, set()):
            self.weight.remove(*labels, scheduled_as)
        for metric in (self.rows, self.duration, self.queue_wait):
            with contextlib.suppress(KeyError):  # never observed under these labels
                metric.remove(*labels)

    def listing(self) -> list[dict[str, object]]:
        """Tracked applications, most recently seen first."""
        return [t.as_dict() for t in reversed(self._apps.values())]
