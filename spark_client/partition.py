"""One partition's requests, answered by the node's server or, failing that, on the CPU.

Runs inside a Spark Python worker. The route is resolved from the task's own environment and
placement; the server is dialled (unix socket first); the batches stream to it. If no server is
reachable at the start, or it fails mid-stream, the batches it has not answered are answered by
the fallback in order, and the rest of the partition follows them there. A batch answered by the
server is never sent to the fallback, so each row is answered exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from spark_client.config import ClientConfig
from spark_client.errors import RemotePredictError, ServerUnavailable
from spark_client.metadata import ModelSpec
from spark_client.routing import NoServerFound, TaskPlacement, fallback_repository, resolve_route
from spark_client.transport import (
    ConnectFailed,
    HeldBatch,
    PredictStream,
    StreamFailed,
    connect,
    forget_channel,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PredictJob:
    """What a UDF closure holds: everything a task needs, immutable, built in the driver."""

    model: str
    spec: ModelSpec
    config: ClientConfig


@dataclass
class _Failure:
    """Why the server path gave up, for the warning or the error."""

    cause: str
    tried: list[str] = field(default_factory=list)
    origin: str = ""

    def describe(self) -> str:
        where = f" (found through {self.origin})" if self.origin else ""
        tried = ", ".join(self.tried) if self.tried else "none"
        return f"addresses tried: {tried}{where}; cause: {self.cause}"


def predict_partition(
    job: PredictJob, requests: Iterator[pa.RecordBatch], environ: Mapping[str, str], placement: TaskPlacement
) -> Iterator[pa.RecordBatch]:
    """One answer per request batch, in order; the server's where it can, the CPU fallback's otherwise."""
    config = job.config
    try:
        route = resolve_route(config, environ, placement)
    except NoServerFound as exc:
        yield from _fall_back(job, [], requests, environ, _Failure(str(exc)))
        return
    failure = _Failure("", origin=route.origin)
    for target in route.targets:
        failure.tried.append(target)
        try:
            channel, _ = connect(target, config, job.model)
        except ConnectFailed as exc:
            failure.cause = f"could not connect: {exc}"
            continue
        stream = PredictStream(channel, target, job.model, config)
        try:
            yield from _conform(stream.run(requests), job.spec)
        except StreamFailed as exc:
            forget_channel(target, config.max_message_bytes)
            failure.cause = (
                f"the server failed mid-partition after {stream.counters.answered} answered batches: "
                f"{exc.reason}"
            )
            yield from _fall_back(job, exc.held, requests, environ, failure)
        else:
            logger.debug(
                "partition %d: %d batches, %d rows answered by %s (%d resends after RESOURCE_EXHAUSTED)",
                placement.partition_id,
                stream.counters.answered,
                stream.counters.rows,
                target,
                stream.counters.resent,
            )
        return
    yield from _fall_back(job, [], requests, environ, failure)


def _fall_back(
    job: PredictJob,
    held: list[HeldBatch],
    rest: Iterator[pa.RecordBatch],
    environ: Mapping[str, str],
    failure: _Failure,
) -> Iterator[pa.RecordBatch]:
    config = job.config
    if config.fallback == "error":
        raise ServerUnavailable(
            f"no model server answered for model {job.model!r} and fallback='error'; {failure.describe()}"
        )
    try:
        repository, repository_origin = fallback_repository(config, environ)
    except LookupError as exc:
        raise ServerUnavailable(
            f"no model server answered for model {job.model!r} ({failure.describe()}), and the CPU fallback "
            f"cannot run: {exc}"
        ) from None
    unanswered = sum(1 for h in held if h.result is None)
    logger.warning(
        "udfserve: predicting model %r on the CPU in this Python worker (%d held batches unanswered, "
        "the rest of the partition follows) with the model from %s (%s); %s",
        job.model,
        unanswered,
        repository,
        repository_origin,
        failure.describe(),
    )
    from spark_client.fallback import predict_on_cpu

    version = config.model_version
    for item in held:
        if item.result is not None:
            yield _conform_one(item.result, job.spec)
        else:
            yield _conform_one(predict_on_cpu(repository, job.model, version, item.batch), job.spec)
    for batch in rest:
        yield _conform_one(predict_on_cpu(repository, job.model, version, batch), job.spec)


def _conform(results: Iterator[pa.RecordBatch], spec: ModelSpec) -> Iterator[pa.RecordBatch]:
    for result in results:
        yield _conform_one(result, spec)


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
