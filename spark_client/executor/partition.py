"""One partition's requests, answered by the node's servers or, failing that, on the CPU.

Runs inside a Spark Python worker. The route is resolved from the task's own environment and
placement; the server is dialled (unix socket first); the batches stream to it. If it cannot
be reached, or fails mid-stream, the batches it has not answered go to the node's next ready
server, else to the CPU fallback, in order, followed by the rest of the partition. A server that
failed is left alone for ``circuit_reset_s`` (``circuit.py``); after that the next batch probes
it, and once it answers again the rest of the partition goes back to it. A server the node's
discovery file announces in its place (restarted: a new pid) is tried at the next batch, unix
socket first, however long the failed one's circuits stay open. A batch a server
answered is never computed again, so each row is answered exactly once.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from udfserve.spark_client.common.errors import RemotePredictError, ServerUnavailable
from udfserve.spark_client.common.model_spec import ModelSpec
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.common.versions import empty_versioned, with_version_column
from udfserve.spark_client.executor.circuit import BREAKERS, CircuitBreakers
from udfserve.spark_client.nodes.routing import (
    NoServerFound,
    Route,
    TaskPlacement,
    discovery_stamp,
    fallback_problem,
    fallback_repository,
    resolve_route,
)
from udfserve.spark_client.observability.job_context import SparkJobContext
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.observability.tracing import task_trace_metadata
from udfserve.spark_client.wire.channels import ConnectFailed, forget_channel
from udfserve.spark_client.wire.credentials import auth_metadata
from udfserve.spark_client.wire.protocols import open_stream
from udfserve.spark_client.wire.transport import PINNED_VERSION_GONE, HeldBatch, PredictStream, StreamFailed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PredictJob:
    """What a UDF closure holds: everything a task needs, immutable, built in the driver.

    ``counters`` is the Spark accumulator of ``ClientStats`` the tasks add to (None where no
    SparkContext exists, as under Spark Connect). ``with_version``: each answer carries a
    ``model_version`` column after the outputs, the version that computed its rows.
    """

    model: str
    spec: ModelSpec
    config: TaskConfig
    application: SparkJobContext = field(default_factory=SparkJobContext)
    counters: Any = field(default=None, compare=False)
    with_version: bool = False
    version_pinned: bool = False
    """``config.model_version`` is the version serving when the UDF was built, pinned for the whole
    job (``version_consistency="job"``): the CPU fallback computes it even once the model's policy
    serves a newer one, as long as its folder is in the repository."""

    def empty_answer(self) -> pa.RecordBatch:
        """The answer to an empty Spark batch, in the columns of every other answer."""
        empty = self.spec.empty_outputs()
        return empty_versioned(empty) if self.with_version else empty


@dataclass
class _Failure:
    """Why the server path gave up, for the warning or the error."""

    cause: str = ""
    kind: str = ""
    tried: list[str] = field(default_factory=list)
    origin: str = ""

    def describe(self) -> str:
        where = f" (found through {self.origin})" if self.origin else ""
        tried = ", ".join(dict.fromkeys(self.tried)) if self.tried else "none"
        return f"addresses tried: {tried}{where}; cause: {self.cause}"


def predict_partition(
    job: PredictJob,
    requests: Iterator[pa.RecordBatch],
    environ: Mapping[str, str],
    placement: TaskPlacement,
    *,
    context: SparkJobContext | None = None,
    stats: ClientStats | None = None,
    breakers: CircuitBreakers = BREAKERS,
) -> Iterator[pa.RecordBatch]:
    """One answer per request batch, in order; the servers' where they can, the CPU fallback's otherwise.

    Each answer holds the model's outputs, and the ``model_version`` column when the job asks for
    it; ``stats.rows_by_version`` counts the rows of each answer by its version either way.
    ``context`` is sent to the server as metadata (default: the job's application); ``stats``,
    when given, is filled as the partition goes.
    """
    runner = _PartitionRunner(
        job, environ, placement, context or job.application, stats or ClientStats(), breakers
    )
    return runner.run(requests)


class _PartitionRunner:
    def __init__(
        self,
        job: PredictJob,
        environ: Mapping[str, str],
        placement: TaskPlacement,
        context: SparkJobContext,
        stats: ClientStats,
        breakers: CircuitBreakers,
    ) -> None:
        self._job = job
        self._config = job.config
        self._environ = environ
        self._placement = placement
        self._stats = stats
        self._breakers = breakers
        self._metadata = auth_metadata(job.config) + context.metadata() + task_trace_metadata(job.config)
        self._failure = _Failure()
        self._quiet_until_s = float("-inf")
        self._quiet_stamp: tuple[int, int, int] | None = None  # the discovery file the quiet is about
        self._failed_since_last_batch: set[str] = set()  # a target is probed once per batch at most
        self._route: Route | None = None
        self._on_cpu = False
        self._cpu_batches = 0
        self._repository: tuple[Path, str] | None = None

    def run(self, requests: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        items: Iterator[HeldBatch] = (HeldBatch(batch) for batch in requests)
        while True:
            target = self._usable_target()
            if target is None:
                item = next(items, None)
                if item is None:
                    return
                yield self._answer_on_cpu(item)
                continue
            stream = self._open_stream(target)
            if stream is None:
                continue
            try:
                for answered in stream.run(items):
                    yield self._answer(answered)
            except StreamFailed as exc:
                if exc.kind == PINNED_VERSION_GONE:
                    self._follow_the_served_version(exc.reason)
                    items = itertools.chain(exc.held, items)
                    continue
                forget_channel(target, self._config)
                # The server answered and then failed: its other address leads to the same process.
                self._server_failed(
                    target,
                    exc.kind,
                    f"the server failed mid-partition after {stream.counters.answered} answered batches: "
                    f"{exc.reason}",
                    whole_server=True,
                )
                items = itertools.chain(exc.held, items)
                continue
            finally:
                self._stats.add_stream(target, stream.counters)
            logger.debug(
                "partition %d: %d batches, %d rows answered by %s (%d resends after RESOURCE_EXHAUSTED)",
                self._placement.partition_id,
                stream.counters.answered,
                stream.counters.rows,
                target,
                stream.counters.resent,
            )
            return

    def _follow_the_served_version(self, reason: str) -> None:
        """The job's pinned version is gone from the server and the job asked to follow: from now on
        this partition asks for the version serving, and the counters say so."""
        logger.warning(
            "udfserve: model %r: the job's version %d is gone (%s); following the version the server "
            "serves for the rest of this partition (when_pinned_version_gone='follow')",
            self._job.model,
            self._config.model_version,
            reason,
        )
        self._config = dataclasses.replace(self._config, model_version=0)
        self._stats.pinned_version_switches += 1

    # -- the server path -------------------------------------------------------------------
    def _usable_target(self) -> str | None:
        """The first target whose circuit lets a batch through, or None (the CPU takes the next batch).

        While every circuit is open (or no server is listed) nothing is dialled until the first
        may be probed, unless the node rewrites its discovery file meanwhile: a server it
        announces (restarted, or ready at last) is tried at the next batch.
        """
        now = self._breakers.now()
        stamp = discovery_stamp(self._config, self._environ)
        if now < self._quiet_until_s and stamp == self._quiet_stamp:
            return None
        reset_s = self._config.circuit_reset_s
        self._quiet_stamp = stamp
        try:
            route = resolve_route(self._config, self._environ, self._placement)
        except NoServerFound as exc:
            self._quiet_until_s = now + reset_s
            self._failure.cause, self._failure.kind = str(exc), exc.kind
            return None
        self._failure.origin = route.origin
        self._route = route
        candidates = route.targets + route.alternates
        for target in candidates:
            if target not in self._failed_since_last_batch and self._breakers.allows(
                target, reset_s, route.server_of(target)
            ):
                return target
        if self._failed_since_last_batch.issuperset(candidates):
            return None  # every target failed for this very batch: the CPU answers it, the next one probes
        self._quiet_until_s = min(
            self._breakers.reopens_at(t, reset_s, route.server_of(t)) for t in candidates
        )
        if not self._failure.kind:  # a failure of an earlier task of this worker opened the circuits
            target = route.targets[0]
            self._failure.tried.append(target)
            self._failure.kind = self._breakers.reason(target, route.server_of(target)) or "circuit_open"
            self._failure.cause = (
                f"{target} failed in an earlier task of this Python worker ({self._failure.kind}); it is "
                f"probed again {reset_s:g} s after that (circuit_reset_s)"
            )
        return None

    def _open_stream(self, target: str) -> PredictStream | None:
        self._failure.tried.append(target)
        try:
            stream = open_stream(target, self._config, self._job.model, self._metadata)
        except ConnectFailed as exc:
            self._server_failed(target, "connect_failed", f"could not connect: {exc}")
            return None
        self._breakers.succeeded(target)
        if self._on_cpu:
            logger.info(
                "udfserve: model %r is back on server %s after %d batches on the CPU in this partition",
                self._job.model,
                target,
                self._cpu_batches,
            )
            self._on_cpu = False
        return stream

    def _server_failed(self, target: str, kind: str, cause: str, whole_server: bool = False) -> None:
        """``whole_server``: every address of the target's server fails with it (a connection
        that could not be made fails only its own address: the server's TCP port may still work)."""
        addresses = self._route.addresses_of(target) if whole_server and self._route else (target,)
        for address in addresses:
            self._failed_since_last_batch.add(address)
            self._breakers.failed(address, kind, self._route.server_of(address) if self._route else None)
        self._stats.add_server_failure(kind)
        self._failure.cause, self._failure.kind = cause, kind

    # -- the answers, whichever path computed them ----------------------------------------
    def _answer(self, held: HeldBatch) -> pa.RecordBatch:
        """An answered batch as the partition hands it back: in the announced output types, with
        its version's column when asked for, and counted by its version."""
        assert held.result is not None
        result = _conform_one(held.result, self._job.spec)
        self._stats.add_answered(result.num_rows, held.version)
        return with_version_column(result, held.version) if self._job.with_version else result

    # -- the CPU path ----------------------------------------------------------------------
    def _answer_on_cpu(self, item: HeldBatch) -> pa.RecordBatch:
        if item.result is not None:  # answered by a server that failed later: never computed twice
            return self._answer(item)
        config = self._config
        if config.fallback == "error":
            raise ServerUnavailable(
                f"no model server answered for model {self._job.model!r} and fallback='error'; "
                f"{self._failure.describe()}"
            )
        repository, repository_origin = self._fallback_repository()
        if not self._on_cpu:
            logger.warning(
                "udfserve: predicting model %r on the CPU in this Python worker until a server answers "
                "again, with the model from %s (%s); %s",
                self._job.model,
                repository,
                repository_origin,
                self._failure.describe(),
            )
            self._on_cpu = True
            self._cpu_batches = 0
        from udfserve.spark_client.executor.fallback import predict_on_cpu

        result, version = predict_on_cpu(
            repository, self._job.model, config.model_version, item.batch, self._job.version_pinned
        )
        self._failed_since_last_batch.clear()
        self._cpu_batches += 1
        self._stats.add_fallback(item.batch.num_rows, self._failure.kind or "no_server", version)
        return self._answer(HeldBatch(item.batch, result, version))

    def _fallback_repository(self) -> tuple[Path, str]:
        if self._repository is None:
            try:
                self._repository = fallback_repository(self._config, self._environ)
            except LookupError as exc:
                tried = self._failure.describe()
                raise ServerUnavailable(
                    f"no model server answered for model {self._job.model!r} ({tried}), and the CPU fallback "
                    f"cannot run: {fallback_problem(exc, tried)}"
                ) from None
        return self._repository


def _conform_one(result: pa.RecordBatch, spec: ModelSpec) -> pa.RecordBatch:
    """The answer in the output types the driver announced, whichever path computed it."""
    schema = spec.output_schema()
    if result.schema.equals(schema):
        return result
    if result.schema.names != schema.names:
        raise RemotePredictError(
            f"model {spec.name!r} answered columns {result.schema.names}; expected {schema.names}"
        )
    return pa.RecordBatch.from_arrays(
        [column.cast(f.type) for column, f in zip(result.columns, schema, strict=True)], schema=schema
    )
