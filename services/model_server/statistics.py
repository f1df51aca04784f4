"""Per-model inference statistics as Triton keeps them: what the KServe statistics extension
(``ModelStatistics``, ``tritonclient``'s ``get_inference_statistics``) answers.

Prometheus histograms already hold these figures, bucketed and labelled for scraping; the
statistics extension wants exact cumulative counts and nanoseconds per model version, and
``perf_analyzer`` reads them before and after each measurement to show where a request's time
went on the server (queue against compute). Both are fed from the same observations
(``ModelMetrics``), on the event loop, so the counters need no lock.

What each field counts here (Triton's definitions, mapped onto udfserve's batcher):

- ``success`` / ``fail``: requests of either protocol, Arrow or KServe, answered OK or not, and
  their time in the server (received to answered);
- ``queue``: the time a queued piece of a request waited for its batch to start (a request larger
  than ``max_batch_size`` is cut into pieces, each counted);
- ``compute_infer``: for each request piece of a successful backend call, that call's duration
  (Triton's rule: a merged call counts once per request it served);
- ``compute_input`` / ``compute_output``: counted as often as ``compute_infer``, with no time of
  their own: the backend call converts its inputs and outputs itself, so that time is inside
  ``compute_infer``;
- ``inference_count``: rows answered successfully; ``execution_count``: successful backend calls;
- ``batch_stats``: successful backend calls and their duration, by rows per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2 as kpb

NS_PER_S = 1_000_000_000


@dataclass
class DurationStat:
    """A count and the nanoseconds it took in all, as ``StatisticDuration``."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += round(seconds * NS_PER_S) * count

    def to_proto(self) -> kpb.StatisticDuration:
        return kpb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass
class ModelStatistics:
    """Cumulative statistics of one served model version since it was loaded."""

    success: DurationStat = field(default_factory=DurationStat)
    fail: DurationStat = field(default_factory=DurationStat)
    queue: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    calls_by_rows: dict[int, DurationStat] = field(default_factory=dict)

    def on_request(self, succeeded: bool, seconds: float, rows: int) -> None:
        self.last_inference_ms = time.time_ns() // 1_000_000
        if succeeded:
            self.success.add(seconds)
            self.inference_count += rows
        else:
            self.fail.add(seconds)

    def on_queue_wait(self, seconds: float) -> None:
        self.queue.add(seconds)

    def on_call(self, rows: int, requests: int, seconds: float) -> None:
        """One successful backend call of ``rows`` rows that served ``requests`` request pieces."""
        self.execution_count += 1
        self.compute_infer.add(seconds, requests)
        by_rows = self.calls_by_rows.get(rows)
        if by_rows is None:
            by_rows = self.calls_by_rows[rows] = DurationStat()
        by_rows.add(seconds)

    def to_proto(self, name: str, version: int) -> kpb.ModelStatistics:
        return kpb.ModelStatistics(
            name=name,
            version=str(version),
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=kpb.InferStatistics(
                success=self.success.to_proto(),
                fail=self.fail.to_proto(),
                queue=self.queue.to_proto(),
                compute_input=kpb.StatisticDuration(count=self.compute_infer.count),
                compute_infer=self.compute_infer.to_proto(),
                compute_output=kpb.StatisticDuration(count=self.compute_infer.count),
            ),
            batch_stats=[
                kpb.InferBatchStatistics(
                    batch_size=rows,
                    compute_input=kpb.StatisticDuration(count=stat.count),
                    compute_infer=stat.to_proto(),
                    compute_output=kpb.StatisticDuration(count=stat.count),
                )
                for rows, stat in sorted(self.calls_by_rows.items())
            ],
        )
