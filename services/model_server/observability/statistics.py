"""Per-model inference statistics as Triton keeps them: what the KServe statistics extension
(``ModelStatistics``, ``tritonclient``'s ``get_inference_statistics``) answers.

Prometheus histograms already hold similar figures, bucketed and labelled for scraping; the
statistics extension wants exact cumulative counts and nanoseconds per model, and
``perf_analyzer`` reads them before and after each measurement to show where a request's time
went on the server (queue against compute, the rest as overhead). Both are fed from the same
observations (``ModelMetrics``), on the event loop, so the counters need no lock.

What each field counts here (Triton's definitions, mapped onto udfserve's batcher), since the
server started (a server loads each model once):

- ``success`` / ``fail``: requests of either protocol, Arrow or KServe, answered OK or not, and
  their time in the request handler (from its start to its answer; gRPC's own receiving and
  sending are outside it);
- ``compute_infer``: once per request the batcher answered, the time of the successful backend
  calls that ran its rows, each call once however many pieces of the request it ran (a merged
  call counts once for every request it served, as Triton counts it);
- ``queue``: once per such request, the rest of its time in the batcher: waiting for its batch,
  the handoffs to and from the inference thread, and calls that failed and were split or run
  again;
- ``compute_input`` / ``compute_output``: counted as often as ``compute_infer``, with no time of
  their own: the backend call converts its inputs and outputs itself, so that time is inside
  ``compute_infer``;
- ``inference_count``: rows answered successfully; ``execution_count``: successful backend calls;
  ``last_inference``: when the last of them ended;
- ``batch_stats``: successful backend calls and their duration, by rows per call.

``success`` minus ``queue`` minus ``compute_infer`` is then the handler's own work around the
batcher (reading the request, writing the answer): what ``perf_analyzer`` prints as overhead. A
request whose answer failed after the model ran (too large to send) is in ``queue`` and
``compute_infer`` but in ``fail``, so the three counts can differ by such requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from udfserve.protocol.kserve import grpc_service_pb2 as kpb

NS_PER_S = 1_000_000_000


@dataclass
class DurationStat:
    """A count and the nanoseconds it took in all, as ``StatisticDuration``."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += round(seconds * NS_PER_S)

    def to_proto(self) -> kpb.StatisticDuration:
        return kpb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass
class ModelStatistics:
    """Cumulative statistics of one served model."""

    success: DurationStat = field(default_factory=DurationStat)
    fail: DurationStat = field(default_factory=DurationStat)
    queue: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    calls_by_rows: dict[int, DurationStat] = field(default_factory=dict)

    def on_request(self, succeeded: bool, seconds: float, rows: int) -> None:
        if succeeded:
            self.success.add(seconds)
            self.inference_count += rows
        else:
            self.fail.add(seconds)

    def on_answered(self, queue_s: float, compute_s: float) -> None:
        """The batcher answered one request (see the module docstring for the split)."""
        self.queue.add(queue_s)
        self.compute_infer.add(compute_s)

    def on_call(self, rows: int, seconds: float) -> None:
        """One successful backend call of ``rows`` rows."""
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
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
