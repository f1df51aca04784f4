"""The trace context a Spark task sends its server: one ``traceparent`` per task, or none.

Off by default: with ``trace_sample_ratio`` 0 and no ``traceparent`` in the config, a task sends
no header and the server records nothing for it. Otherwise:

- ``ClientConfig.traceparent`` (the job's one trace, given in the driver, for instance by
  ``job_traceparent()``): every task's requests become children of that span, in that trace,
  recorded when its sampled flag is set;
- else ``trace_sample_ratio``: each task starts a trace of its own, sampled with that
  probability; the server records the requests of a sampled task, and of no other.

A job can be traced without code: the Spark conf ``spark.udfserve.trace.job=true`` gives the UDF's
job a trace of its own, made in the driver when the UDF is built;
``spark.udfserve.trace.parent`` names one, ``spark.udfserve.trace.sampleRatio`` samples tasks
(``apply_trace_conf``, in the driver with the other ``spark.udfserve`` keys).

Nothing here imports OpenTelemetry: the header is made by ``udfserve.tracing``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.credentials import CallMetadata
from udfserve.tracing import TRACEPARENT_KEY, TraceParent, new_traceparent, parse_traceparent, sampled_with

if TYPE_CHECKING:  # the driver's type: a task imports no pydantic
    from udfserve.spark_client.common.config import ClientConfig

logger = logging.getLogger(__name__)

_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off", ""})


def task_trace_metadata(config: TaskConfig) -> CallMetadata:
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


SPARK_CONF_TRACE_JOB = "spark.udfserve.trace.job"
SPARK_CONF_TRACE_PARENT = "spark.udfserve.trace.parent"
SPARK_CONF_TRACE_SAMPLE_RATIO = "spark.udfserve.trace.sampleRatio"
SPARK_CONF_TRACE_KEYS = (SPARK_CONF_TRACE_JOB, SPARK_CONF_TRACE_PARENT, SPARK_CONF_TRACE_SAMPLE_RATIO)
"""The Spark conf keys that trace a job without a change to its code, read in the driver."""


def apply_trace_conf(config: ClientConfig, conf: Mapping[str, str]) -> ClientConfig:
    """Fill the config's tracing from the Spark conf, in the driver, when the UDF is built: a
    field the config sets beats its key, ``spark.udfserve.trace.parent`` beats
    ``spark.udfserve.trace.job`` (a new trace for the UDF's job, made here and logged).
    ValueError naming the key for a value that is not a switch, a traceparent or a ratio."""
    from udfserve.spark_client.common.config import with_conf_values  # the driver's: pydantic

    update: dict[str, object] = {}
    used: list[str] = []
    if "trace_sample_ratio" not in config.model_fields_set and conf.get(SPARK_CONF_TRACE_SAMPLE_RATIO):
        update["trace_sample_ratio"] = conf[SPARK_CONF_TRACE_SAMPLE_RATIO].strip()
        used.append(SPARK_CONF_TRACE_SAMPLE_RATIO)
    if "traceparent" not in config.model_fields_set:
        if conf.get(SPARK_CONF_TRACE_PARENT):
            update["traceparent"] = conf[SPARK_CONF_TRACE_PARENT].strip()
            used.append(SPARK_CONF_TRACE_PARENT)
        elif _switch(conf.get(SPARK_CONF_TRACE_JOB, ""), SPARK_CONF_TRACE_JOB):
            update["traceparent"] = job_traceparent()
            used.append(SPARK_CONF_TRACE_JOB)
            logger.info(
                "udfserve: the job's requests are traced under trace %s (%s)",
                str(update["traceparent"]).split("-")[1],
                SPARK_CONF_TRACE_JOB,
            )
    return with_conf_values(config, update, used)


def _switch(value: str, key: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"the Spark conf {key}={value!r} is not a switch; expected true or false")
