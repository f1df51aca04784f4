"""Which Spark job a request belongs to, sent to the server as gRPC metadata on every stream.

The server uses it for labelling only (per-application metrics, the listing of applications,
the logs of slow or failed requests; see the server's ``job_context.py``) and drops a value it
does not accept: so the client cuts each value to what the server takes, printable ASCII within
a length bound, rather than lose it. The application id and name are read in the driver when
the UDF is built; the job group and description (Spark's local properties), the stage,
partition and attempt at task time from ``TaskContext``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from udfserve.spark_job_keys import MAX_VALUE_CHARS, METADATA_PREFIX

JOB_GROUP_PROPERTY = "spark.jobGroup.id"
JOB_DESCRIPTION_PROPERTY = "spark.job.description"


def sanitise(value: str, max_chars: int) -> str:
    """``value`` as gRPC metadata can carry it and the server accepts it: printable ASCII only
    (anything else becomes ``?``), runs of whitespace as one space, at most ``max_chars``."""
    text = " ".join(value.split())
    text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text[:max_chars].strip()


@dataclass(frozen=True)
class SparkJobContext:
    """The Spark context of one task's stream; empty fields are not sent."""

    app_id: str = ""
    app_name: str = ""
    job_group: str = ""
    job_description: str = ""
    stage_id: int | None = None
    partition_id: int | None = None
    task_attempt: int | None = None
    priority_class: str = ""
    """The class the application asks the servers to schedule it in (``ClientConfig.priority_class``)."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The ``udfserve-spark-*`` pairs, each value sanitised to the server's bound."""
        pairs = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value == "":
                continue
            key = f.name.replace("_", "-")
            text = sanitise(str(value), MAX_VALUE_CHARS[key])
            if text:
                pairs.append((METADATA_PREFIX + key, text))
        return tuple(pairs)

    def for_task(self, task_context: Any) -> SparkJobContext:
        """This application's context completed with what a running task knows (a ``TaskContext``)."""
        if task_context is None:
            return self
        return dataclasses.replace(
            self,
            job_group=task_context.getLocalProperty(JOB_GROUP_PROPERTY) or "",
            job_description=task_context.getLocalProperty(JOB_DESCRIPTION_PROPERTY) or "",
            stage_id=task_context.stageId(),
            partition_id=task_context.partitionId(),
            task_attempt=task_context.attemptNumber(),
        )


def application_context(spark: Any, priority_class: str | None = None) -> SparkJobContext:
    """The application id and name of a driver's session, and the class it asks to be scheduled
    in; the id and name empty when they cannot be read."""
    asked = priority_class or ""
    if spark is None:
        return SparkJobContext(priority_class=asked)
    try:
        return SparkJobContext(
            app_id=spark.conf.get("spark.app.id", "") or "",
            app_name=spark.conf.get("spark.app.name", "") or "",
            priority_class=asked,
        )
    except Exception:  # a session being stopped, or a Spark Connect server refusing the keys
        return SparkJobContext(priority_class=asked)
