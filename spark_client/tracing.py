"""``job_traceparent``, where the documentation and jobs import it from.

The trace header a task sends is ``udfserve.spark_client.observability.tracing``'s; this module
names only its public function, for the driver (``ClientConfig(traceparent=job_traceparent())``).
The function is defined once: cloudpickle and logging know it by its own module.
"""

from __future__ import annotations

from udfserve.spark_client.observability.tracing import job_traceparent

__all__ = ["job_traceparent"]
