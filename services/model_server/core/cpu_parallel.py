"""Backend calls on a CPU device cut into one part per core, run concurrently (opt-in).

A framework's own intra-op parallelism splits each op of a call across threads, which costs
synchronisation per op; the server keeps TensorFlow's intra-op pool one core short (the event
loop needs a core for small requests, which gain nothing from splitting). Large calls can use
the cores by rows instead: rows are independent in a batch, so the parts' outputs, joined in
order, are the call's outputs. A GPU does this parallelism itself; on a GPU device nothing is cut.

It is a latency trade, off by default (``--cpu-parallel-min-rows``): a cut call finishes sooner
but costs more CPU time (the parts' start and join). So a call is cut only when the server has
nothing else to do: no rows queued for the model and no other backend call running
(``CallsInFlight``, over all models); otherwise the waiting work takes the cores anyway, and
cutting merged calls while the event loop needs a core loses rows/s. Turn it on for a server
whose cores idle while it answers a few large requests, not for one whose idle cores Spark
executors use. The measurements: docs/benchmarks.md, section 6 ("Reading the numbers").

Parts are contiguous row ranges whose starts are multiples of ``ROW_ALIGNMENT`` rows, so that
each part of an aligned batch stays aligned (frameworks take aligned memory without a copy).
An error in any part is the call's error, raised once every part has finished: the batcher then
treats it as it would the whole call's (out of memory: split and retry; a bad row: run each
merged request alone), so no row is answered twice or lost.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np

Arrays = Mapping[str, np.ndarray]
PredictFn = Callable[[Arrays], Mapping[str, np.ndarray]]

ROW_ALIGNMENT = 64
"""Part boundaries fall on multiples of this many rows: a multiple of 64 bytes for any row size."""
SUGGESTED_MIN_ROWS_PER_PART = 256
"""Where cutting starts to pay for the example MLP on an idle core (the benchmarks time it)."""


class CallsInFlight:
    """How many backend calls a server runs right now, over all its models (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @contextmanager
    def running(self) -> Iterator[int]:
        """Count one call for the duration of the block; yields the count including it."""
        with self._lock:
            self._count += 1
            now = self._count
        try:
            yield now
        finally:
            with self._lock:
                self._count -= 1


class CoreParallelPredict:
    """``predict`` with calls of at least ``2 * min_rows_per_part`` rows cut into up to ``parts``
    contiguous parts run concurrently: the first in the calling thread, the others in ``executor``
    (which needs ``parts - 1`` threads to run them all at once)."""

    def __init__(
        self,
        predict: PredictFn,
        *,
        parts: int,
        min_rows_per_part: int,
        executor: concurrent.futures.Executor,
        calls: CallsInFlight | None = None,
        queued_rows: Callable[[], int] = lambda: 0,
    ) -> None:
        if parts < 2:
            raise ValueError(f"parts must be at least 2, received {parts}")
        if min_rows_per_part < ROW_ALIGNMENT:
            raise ValueError(
                f"min_rows_per_part must be at least {ROW_ALIGNMENT}, received {min_rows_per_part}"
            )
        self._predict = predict
        self._parts = parts
        self._min_rows = min_rows_per_part
        self._executor = executor
        self._calls = calls if calls is not None else CallsInFlight()
        self._queued_rows = queued_rows

    def bounds(self, rows: int) -> list[int]:
        """Where the parts of a call of ``rows`` rows start and end: ``[0, ..., rows]``."""
        parts = min(self._parts, rows // self._min_rows)
        if parts < 2:
            return [0, rows]
        step = rows / parts
        inner = [int(step * i) // ROW_ALIGNMENT * ROW_ALIGNMENT for i in range(1, parts)]
        return [0, *inner, rows]

    def __call__(self, inputs: Arrays) -> dict[str, np.ndarray]:
        with self._calls.running() as calls_now:
            if calls_now > 1 or self._queued_rows() > 0:  # other work would take the cores anyway
                return dict(self._predict(inputs))
            return self._cut(inputs)

    def _cut(self, inputs: Arrays) -> dict[str, np.ndarray]:
        rows = len(next(iter(inputs.values()))) if inputs else 0
        bounds = self.bounds(rows)
        if len(bounds) == 2:
            return dict(self._predict(inputs))
        pieces = [
            {name: array[start:stop] for name, array in inputs.items()}
            for start, stop in itertools.pairwise(bounds)
        ]
        others = [self._executor.submit(self._predict, piece) for piece in pieces[1:]]
        try:
            first = self._predict(pieces[0])
        finally:
            concurrent.futures.wait(others)
        outputs = [first, *(future.result() for future in others)]
        return {name: np.concatenate([output[name] for output in outputs]) for name in first}
