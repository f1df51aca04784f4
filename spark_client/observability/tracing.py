"""The trace context a Spark task sends its server: one ``traceparent`` per task, or none.

Off by default: with ``trace_sample_ratio`` 0 and no ``traceparent`` in the config, a task sends
no header and the server records nothing for it. Otherwise:

- ``ClientConfig.traceparent`` (the job's one trace, given in the driver, for instance by
  ``job_traceparent()``): every task's requests become children of that span, in that trace,
  recorded when its sampled flag is set;
- else ``trace_sample_ratio``: each task starts a trace of its own, sampled with that
  probability; the server records the requests of a sampled task, and of no other.

A job can be traced without code: the Spark conf ``spark.udfserve.trace.job=true`` gives the UDF's
job a trace of its own, made in the driver when the UDF is built (``conf_job_traceparent``);
``spark.udfserve.trace.parent`` names one, ``spark.udfserve.trace.sampleRatio`` samples tasks
(``nodes.routing.apply_spark_conf`` reads them).

Nothing here imports OpenTelemetry: the header is made by ``udfserve.tracing``.
"""

from __future__ import annotations

import logging
import sys

from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.wire.credentials import CallMetadata
from udfserve.tracing import TRACEPARENT_KEY, TraceParent, new_traceparent, parse_traceparent, sampled_with

logger = logging.getLogger(__name__)

_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off", ""})


def task_trace_metadata(config: ClientConfig) -> CallMetadata:
    """The ``traceparent`` pair this task's streams carry, or nothing when tracing is off."""
    if config.traceparent is not None:
        return ((TRACEPARENT_KEY, config.traceparent),)
    ratio = config.trace_sample_ratio
    if ratio <= 0.0:
        return ()
    return ((TRACEPARENT_KEY, new_traceparent(sampled_with(ratio)).header()),)


def job_traceparent(sampled: bool = True) -> str:
    """A ``traceparent`` for ``ClientConfig(traceparent=...)``, made in the driver: the active
    OpenTelemetry span's when the driver traces with OpenTelemetry (the job's requests then
    appear under that span), else a new trace of its own."""
    current = _active_span_context()
    if current is not None:
        return current.header()
    return new_traceparent(sampled).header()


def _active_span_context() -> TraceParent | None:
    """The driver's active OpenTelemetry span, in a process that imported OpenTelemetry."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return parse_traceparent(
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    )


def conf_job_traceparent(value: str, key: str) -> str | None:
    """For the Spark conf ``key`` (``spark.udfserve.trace.job``): a job traceparent when its
    ``value`` is true (``job_traceparent()``, logged so that the trace can be found), None when
    false or unset; ValueError naming the key for anything else."""
    word = value.strip().lower()
    if word in _FALSE:
        return None
    if word not in _TRUE:
        raise ValueError(f"the Spark conf {key}={value!r} is not a switch; expected true or false")
    traceparent = job_traceparent()
    context = parse_traceparent(traceparent)
    logger.info(
        "udfserve: the job's requests are traced under trace %s (%s)",
        context.trace_id_hex if context is not None else traceparent,
        key,
    )
    return traceparent
