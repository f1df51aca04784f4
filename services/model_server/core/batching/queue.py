"""The queue of one model: admission, chunks, and the batch the oldest request would run in.

Requests from many streams wait in one FIFO queue.

- The queue is bounded in rows (``max_queue_rows``). A request that would overflow it is refused
  whole with ``QueueFull`` (back-pressure), none of its chunks queued. An empty queue admits any
  one request, so a request larger than the whole queue is delayed, never refused forever.
- A request larger than the batch limit is cut into chunks of at most that many rows, queued
  together (``answers.whole_request`` answers them in order); it is never refused for its size.
- A request of zero rows is a caller error (``ValueError``): the outputs' per-row shapes are
  unknown without running the model, so callers answer empty batches themselves.
- A batch takes the oldest chunk and the chunks behind it with the same signature (names, dtypes
  and per-row shapes: free dimensions are never merged) until the next would not fit the limit.
  With batching disabled every chunk runs alone, still through the queue and the executor, so
  that batching on and off can be compared under the same load.
- A chunk whose caller went away (its future was cancelled) leaves the queue at once and frees its
  rows; it is passed over until then.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from udfserve.services.model_server.errors import QueueFull

Arrays = dict[str, np.ndarray]


@dataclass(eq=False)
class Chunk:
    """Up to the batch limit's rows of one request, answered through ``future``.

    ``first_row`` is where the chunk starts in its request of ``request_rows`` rows, so that an
    error about one row can name it as the client numbers it. ``request`` numbers the requests,
    so that a batch can tell how many it merged. ``at_once``: the request found the batcher idle
    and starts a batch without waiting for the delay.
    """

    inputs: Arrays
    rows: int
    signature: tuple[Any, ...]
    future: asyncio.Future[Arrays]
    enqueued_at_s: float
    first_row: int = 0
    request_rows: int = 0
    request: int = 0
    at_once: bool = False
    compute_s: float = 0.0
    """Time in the successful backend calls that ran this chunk's rows, so far."""
    queued_at_pc: float = 0.0
    """``time.perf_counter()`` when queued, the clock of the calls' durations (an event loop's
    ``time()`` may be that of the start of its current iteration, as uvloop's is)."""


def signature(inputs: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """Requests merge only when every array agrees on dtype and per-row shape."""
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(inputs.items()))


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's row count; ``ValueError`` for no arrays, arrays that disagree, or no rows."""
    if not inputs:
        raise ValueError("a request needs at least one input array")
    arrays = iter(inputs.values())
    rows = len(next(arrays))
    if any(len(array) != rows for array in arrays):
        counts = {name: len(array) for name, array in inputs.items()}
        raise ValueError(f"input arrays differ in row count: {counts}")
    if rows == 0:
        raise ValueError("empty request: callers answer zero-row requests without queuing them")
    return rows


class RequestQueue:
    """The chunks waiting for a batch, oldest first, and the rows they hold.

    ``on_cancelled`` is called after a cancelled chunk left the queue (a drain may be waiting for
    the queue to empty).
    """

    def __init__(self, model_name: str, max_rows: int, on_cancelled: Callable[[], None]) -> None:
        self.model_name = model_name
        self.max_rows = max_rows
        self.chunks: deque[Chunk] = deque()
        self.rows = 0
        """Rows waiting, not counting the batches running."""
        self.requests = 0
        """Requests admitted so far: the number of the last one."""
        self._on_cancelled = on_cancelled

    def admit(self, rows: int) -> None:
        """Number one more request of ``rows`` rows, or refuse it with ``QueueFull``."""
        if self.rows > 0 and self.rows + rows > self.max_rows:
            raise QueueFull(
                f"model '{self.model_name}': queue full: {self.rows} rows queued, this request "
                f"has {rows}, the limit is {self.max_rows} rows; retry later"
            )
        self.requests += 1

    def put(
        self,
        inputs: Arrays,
        rows: int,
        limit: int,
        loop: asyncio.AbstractEventLoop,
        now_s: float,
        at_once: bool,
    ) -> list[Chunk]:
        """Queue the request just admitted, in chunks of at most ``limit`` rows."""
        queued_at_pc = time.perf_counter()
        request_signature = signature(inputs)
        request = self.requests
        if rows <= limit:
            chunks = [
                Chunk(inputs, rows, request_signature, loop.create_future(), now_s, 0, rows, request, at_once)
            ]
        else:
            chunks = [
                Chunk(
                    {name: array[start : start + limit] for name, array in inputs.items()},
                    min(limit, rows - start),
                    request_signature,
                    loop.create_future(),
                    now_s,
                    start,
                    rows,
                    request,
                    at_once,
                )
                for start in range(0, rows, limit)
            ]
        for chunk in chunks:
            chunk.queued_at_pc = queued_at_pc
            chunk.future.add_done_callback(self._on_chunk_done)
        self.chunks.extend(chunks)
        self.rows += rows
        return chunks

    def candidates(self, limit: int, merge: bool) -> tuple[list[Chunk], bool]:
        """The batch the oldest chunk would run in now, and whether it can still grow. Chunks
        cancelled whose callback has not run yet are passed over. Without ``merge`` (batching
        disabled) the oldest chunk runs alone."""
        head: Chunk | None = None
        batch: list[Chunk] = []
        rows = 0
        for chunk in self.chunks:
            if chunk.future.done():
                continue
            if head is None:
                head = chunk
                if not merge:
                    return [chunk], False
            elif chunk.signature != head.signature:
                continue
            # The head always runs, even when queued before the limit dropped below its size.
            if batch and rows + chunk.rows > limit:
                return batch, False
            batch.append(chunk)
            rows += chunk.rows
        return batch, rows < limit

    def take(self, batch: list[Chunk]) -> None:
        """Remove the chunks of a batch that starts; their cancellation is the runner's now."""
        queue = self.chunks
        if all(queued is chunk for queued, chunk in zip(queue, batch, strict=False)):
            for _ in batch:
                queue.popleft()
        else:
            taken = set(batch)
            self.chunks = deque(chunk for chunk in queue if chunk not in taken)
        for chunk in batch:
            self.rows -= chunk.rows
            chunk.future.remove_done_callback(self._on_chunk_done)

    def clear(self) -> None:
        """Forget every chunk (their callers were answered otherwise)."""
        self.chunks.clear()
        self.rows = 0

    def _on_chunk_done(self, future: asyncio.Future[Arrays]) -> None:
        """A chunk cancelled while queued leaves the queue at once, freeing its rows (the callback
        is removed when a chunk is taken into a batch)."""
        for chunk in self.chunks:
            if chunk.future is future:
                self.chunks.remove(chunk)
                self.rows -= chunk.rows
                self._on_cancelled()
                return
