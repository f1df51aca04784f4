"""What the client did, counted per task and summed in the driver through a Spark accumulator.

Each task fills a ``ClientStats`` while it runs and adds it to the UDF's accumulator once, when
its partition ends. The driver reads the sum with ``udf.stats()``. Spark applies accumulator
updates made inside transformations at least once: a task that is re-run (a lost executor, a
recomputed stage, speculation) or a DataFrame evaluated by several actions adds its counts again.
The counts are exact for one action over a job whose tasks each ran once.

A Spark Connect session has no SparkContext and so no accumulator: there ``stats()`` raises
``CountersUnavailable``, naming the application id under which the model servers count the
UDF's rows instead (their per-application metrics, which the job context feeds under Connect too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from udfserve.spark_client.observability.job_context import SparkJobContext
from udfserve.spark_client.wire.transport import StreamCounters

Key = TypeVar("Key", str, int)


@dataclass
class ClientStats:
    """Rows and batches answered by the servers and by the CPU fallback, and why it was used.

    ``server_failures`` counts each time a server failed (could not be reached, broke a stream,
    missed a deadline), whether its batches then went to another server or to the fallback;
    ``fallback_reasons`` counts the batches the fallback answered, by the failure that sent them
    there. Reasons are short labels: ``no_server``, ``connect_failed``, ``deadline_exceeded``,
    ``retry_time_exceeded``, ``server_error:<gRPC code>``, ``stream_error:<gRPC code>``,
    ``stream_closed``, ``bad_answer``.

    ``rows_by_version`` counts the rows handed back to Spark by the model version that computed
    them, servers' and fallback's alike (0: a server that did not name its version); it agrees
    with the version column of a UDF that answers it. ``fallback_rows_by_version`` counts the
    fallback's rows among them.
    """

    rows_by_server: int = 0
    rows_by_fallback: int = 0
    batches_by_server: int = 0
    batches_by_fallback: int = 0
    retries: int = 0
    sends: int = 0
    """Requests sent to servers: a batch answered by a server took one send, and one more per resend
    (``retries``); a batch a server failed took sends that no answer came back for."""
    sends_in_shared_memory: int = 0
    """Of ``sends``, those whose payload went through the node's shared memory (the rest inline)."""
    backoff_waits: int = 0
    backoff_s: float = 0.0
    tasks: int = 0
    """Partitions counted (one per Spark task that ran the UDF)."""
    task_s: float = 0.0
    """Their time, summed: each from the start of its partition to its end. ``backoff_s`` counts
    each batch's waits; batches of one task wait side by side, so it can exceed this."""
    server_failures: dict[str, int] = field(default_factory=dict)
    fallback_reasons: dict[str, int] = field(default_factory=dict)
    rows_by_address: dict[str, int] = field(default_factory=dict)
    rows_by_version: dict[int, int] = field(default_factory=dict)
    fallback_rows_by_version: dict[int, int] = field(default_factory=dict)
    pinned_version_switches: int = 0
    """Partitions that left the job's pinned version for the one serving, because a server no longer
    kept it (``when_pinned_version_gone="follow"``); 0 means every row came from the pinned one."""

    @property
    def rows(self) -> int:
        return self.rows_by_server + self.rows_by_fallback

    def add_stream(self, target: str, counters: StreamCounters) -> None:
        self.rows_by_server += counters.rows
        self.batches_by_server += counters.answered
        self.retries += counters.resent
        self.sends += counters.sent
        self.sends_in_shared_memory += counters.sent_in_shared_memory
        self.backoff_waits += counters.backoff_waits
        self.backoff_s += counters.backoff_s
        if counters.rows:
            _count(self.rows_by_address, target, counters.rows)

    def add_fallback(self, rows: int, reason: str, version: int) -> None:
        self.rows_by_fallback += rows
        self.batches_by_fallback += 1
        _count(self.fallback_reasons, reason, 1)
        _count(self.fallback_rows_by_version, version, rows)

    def add_answered(self, rows: int, version: int) -> None:
        """Rows handed back to Spark, computed by ``version`` (a server's or the fallback's)."""
        _count(self.rows_by_version, version, rows)

    def add_server_failure(self, reason: str) -> None:
        _count(self.server_failures, reason, 1)

    def merge(self, other: ClientStats) -> ClientStats:
        """Add ``other`` into this one (in place) and return it."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                for key, value in theirs.items():
                    _count(mine, key, value)
            else:
                setattr(self, f.name, mine + theirs)
        return self


class ClientStatsParam:
    """Spark's way of adding two ``ClientStats``: the zero is empty, sums go field by field.

    PySpark asks an accumulator's param only for ``zero`` and ``addInPlace`` (its
    ``AccumulatorParam`` is a base class with nothing else), so this one does not derive from it:
    the client's partition path, which imports this module, then runs where PySpark is not
    installed (``benchmarks.gpu_check`` scores through it on a machine without Spark).
    """

    def zero(self, value: ClientStats) -> ClientStats:
        return ClientStats()

    def addInPlace(self, value1: ClientStats, value2: ClientStats) -> ClientStats:
        return value1.merge(value2)


def _count(counts: dict[Key, int], key: Key, amount: int) -> None:
    counts[key] = counts.get(key, 0) + amount


def new_accumulator(spark_context: Any) -> Any:
    """An accumulator of ``ClientStats`` in the driver."""
    return spark_context.accumulator(ClientStats(), ClientStatsParam())


class CountersUnavailable(RuntimeError):
    """``stats()`` of a UDF built where there is no SparkContext to hold its accumulator (a Spark
    Connect session, or no active SparkSession); the message says what counts the rows instead."""


def counters_unavailable(application: SparkJobContext) -> CountersUnavailable:
    """The error ``stats()`` raises for a UDF without an accumulator, pointing a Spark Connect user
    at the servers' per-application counts of the application its requests name."""
    if not application.app_id:
        return CountersUnavailable(
            "no client counters: this UDF was built without a SparkContext (no active SparkSession, or a "
            "Spark Connect session that did not tell its application id), so no Spark accumulator sums "
            "its tasks' counts and its requests name no application; expected a SparkSession started "
            "before the UDF is built"
        )
    app_id = application.app_id
    return CountersUnavailable(
        f"no client counters: this UDF was built in a Spark Connect session (application {app_id!r}, "
        f"name {application.app_name!r}), which has no SparkContext, so no Spark accumulator sums its "
        "tasks' counts. The model servers count the rows they answer per application instead: read "
        f'GET /v1/spark/applications or udfserve_app_rows_total{{app_id="{app_id}"}} on each server; '
        "rows the CPU fallback answered are not counted there (each partition that moves to the CPU "
        "logs a WARNING in its executor's log; on a node with a supervisor, its /metrics counts them as "
        f'udfserve_client_fallback_rows_total{{application="{app_id}"}}), and with_version=True '
        "answers each row's model version as a column"
    )
