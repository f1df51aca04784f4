"""Which flow of a model's queue a request waits in, and its weight: the fair share per application.

A node's servers are shared by every Spark application on the node. The queue (``batching.queue``)
serves applications by weighted fair queueing in rows; this module says who is an application and
what it is owed. The application is the Spark application id the client sends; requests that name
none (KServe clients, tritonclient, perf_analyzer) form one more application. The weight comes from
the priority class the client names, but only the server's own table gives weights: a class it does
not list, or none, gets its default class, so a client can claim no more than the server allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from udfserve.services.model_server.core.batching.queue import Share
from udfserve.services.model_server.core.job_context import JobContext

WaitObserver = Callable[[JobContext, str, int | None, float], None]
"""Hears the queue wait of each chunk of an application's requests, with the class and weight it
was scheduled with (its metrics; no weight under first in first out, which applies none)."""


class ApplicationShares:
    """The server's scheduling of applications: ``fair`` (a flow per application, weighted by class)
    or ``fifo`` (every request in one flow, in arrival order)."""

    def __init__(
        self,
        scheduling: str,
        class_weights: Mapping[str, int],
        default_class: str,
        observe_wait: WaitObserver | None = None,
    ) -> None:
        if default_class not in class_weights:
            raise ValueError(f"default class {default_class!r} is not one of {sorted(class_weights)}")
        self.fair = scheduling == "fair"
        self.class_weights = dict(class_weights)
        self.default_class = default_class
        self._observe_wait = observe_wait
        self._unnamed = Share(flow="", weight=float(class_weights[default_class]))

    def class_of(self, job: JobContext) -> str:
        """The class the server schedules ``job`` in: the one it names if listed, else the default."""
        asked = job.priority_class
        return asked if asked in self.class_weights else self.default_class

    def share_of(self, job: JobContext) -> Share:
        """The flow and weight of a request of ``job``."""
        observe = self._observe_wait
        if not self.fair:
            # one flow in arrival order; each application's queue wait is still its metric, so that
            # the two schedulings can be compared by it (no weight: none is applied)
            if observe is None or not job.has_application:
                return Share()
            return Share(on_start=_bound(observe, job, self.class_of(job), None))
        if not job.has_application:
            return self._unnamed
        scheduled_as = self.class_of(job)
        weight = self.class_weights[scheduled_as]
        on_start = None if observe is None else _bound(observe, job, scheduled_as, weight)
        return Share(flow=job.app_id, weight=float(weight), on_start=on_start)


def _bound(
    observe: WaitObserver, job: JobContext, scheduled_as: str, weight: int | None
) -> Callable[[float], None]:
    def on_start(seconds: float) -> None:
        observe(job, scheduled_as, weight, seconds)

    return on_start
