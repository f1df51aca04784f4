"""The dynamic batcher of one model: merges concurrent requests into few backend calls.

Requests from many streams wait in one queue; batches of them run as one backend call each, in
an executor, and every request gets its own rows back. One part per rule:

- ``queue``: admission (bounded in rows, ``QueueFull``), chunks of a request larger than the batch
  limit, which requests may merge, and the batch the oldest request would run in;
- ``dispatch``: when a batch starts (at once when idle, when full, after the delay, or when the
  clients of the last merged batch are back), with one timer and no polling;
- ``runner``: one call per batch, answered from its completion callback;
- ``recovery``: the rare batches that need several calls, in a task: split on out of memory,
  and a failed merged call re-run request by request;
- ``row_limit``: the batch limit, lowered on out of memory and grown back;
- ``answers``: each call's outputs checked, a request's outputs joined, errors as the caller gets them;
- ``observers``: the measurements handed to the metrics;
- ``batcher``: ``DynamicBatcher``, the parts put together: start, refusals, stop and drain.
"""

from udfserve.services.model_server.core.batching.batcher import DynamicBatcher
from udfserve.services.model_server.core.batching.observers import (
    AnswerObserver,
    BatchObserver,
    MemoryObserver,
)
from udfserve.services.model_server.core.batching.queue import Arrays
from udfserve.services.model_server.core.batching.row_limit import LIMIT_RECOVERY_CALLS, LIMIT_RECOVERY_STEPS
from udfserve.services.model_server.core.batching.runner import PredictFn

__all__ = [
    "LIMIT_RECOVERY_CALLS",
    "LIMIT_RECOVERY_STEPS",
    "AnswerObserver",
    "Arrays",
    "BatchObserver",
    "DynamicBatcher",
    "MemoryObserver",
    "PredictFn",
]
