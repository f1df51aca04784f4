"""The dynamic batcher of one model: merges concurrent requests into few backend calls.

Requests from many streams wait in one FIFO queue. A batch takes the oldest request and the
requests behind it until the next would not fit in the batch limit (``max_batch_size`` rows
unless the backend ran out of memory, below). When a batch starts:

- At once when a request finds the batcher idle (nothing queued, no batch running): a lone
  client never waits for partners that cannot come. The batch merges whatever was queued by the
  time the batcher runs (the requests that arrived in the same turn of the event loop).
- Otherwise requests accumulate, also while batches run: a batch starts when it is full, or when
  its oldest request has waited ``max_queue_delay_s``, and a slot is free
  (``max_concurrent_batches``).
- The returning cohort. When a batch of several requests finishes, their clients are likely to
  send again at once (a closed loop: Spark tasks, perf_analyzer, anything that waits for its
  answer). Until as many requests as that batch merged have arrived after it finished, or
  ``max_queue_delay_s`` has passed since then, a request finding the batcher idle does not start
  alone, and a batch that can still grow waits for them, even if its oldest request waited its
  delay while the finished batch ran. Once they are all back the batch starts without waiting for
  the rest of the delay. Without this rule a closed loop of N clients settles into two
  alternating batches (the requests queued during a call, then the ones answered by it) or a
  batch of one followed by the others after the whole delay; with it, one batch of all N per
  round trip. The wait it adds is bounded by ``max_queue_delay_s`` after the finished batch.

One backend call runs in the executor per batch and its outputs are split back by row counts.
Nothing polls and nothing runs per request beyond queueing: a request wakes the batcher only
when a batch could be due, a waiting batch has one timer for its delay, and a call that
succeeds is answered from its completion callback (a task runs only for the rare batches that
need several calls: out of memory, or a failed merged call).

Decisions callers rely on:

- A request larger than the batch limit is cut into chunks of at most that many rows, queued
  together and answered in order; it is never refused for its size. A chunk is split across
  backend calls only after the backend ran out of memory (below).
- The queue is bounded in rows (``max_queue_rows``). A request that would overflow it is refused
  whole with ``QueueFull`` (back-pressure), none of its chunks queued. An empty queue admits any
  one request, so a request larger than the whole queue is delayed, never refused forever.
- A request of zero rows is a caller error (``ValueError``): the outputs' per-row shapes are
  unknown without running the model, so callers answer empty batches themselves.
- Requests whose arrays differ in per-row shape or dtype (free dimensions) are never merged.
- With batching disabled every chunk runs alone, still through the queue and the executor, so
  that batching on and off can be compared under the same load.
- A request whose caller went away (its task was cancelled) is dropped before it runs.
- When a merged call fails, each request that shared it is run again alone, so only the bad one
  fails and the requests merged with it still get their answers. ``ServingError`` subclasses reach the
  caller as they are; anything else becomes ``BackendFault`` with the exception's type and text.
- Every output must have exactly one row per input row of the batch, else ``BackendFault``.

Out of device memory. A backend reports it by raising ``DeviceOutOfMemory`` (the TensorFlow
backend maps the framework's own resource-exhausted error to it). The call is then split in
halves, each half run on its own and split again if it still does not fit, down to one row;
every row is still answered exactly once and in order. A single row that does not fit alone
fails its request with ``DeviceOutOfMemory`` (RESOURCE_EXHAUSTED) naming the model and the row.
When a call ran out of memory and no row of it fails alone, its size is to blame: the batch
limit (initially ``max_batch_size``) drops to the largest part of it that fitted, so later
batches do not rediscover the limit with a failed call each (a failed allocation can cost
seconds: TensorFlow's BFC allocator retries for up to 10 s before giving up). A call that failed
because of a row too big to fit alone lowers nothing: one such row must not throttle everyone
else's batches. The limit recovers
additively: after ``LIMIT_RECOVERY_CALLS`` successful calls of the full limit in a row it grows
by ``max_batch_size // LIMIT_RECOVERY_STEPS`` (at least one row), up to ``max_batch_size``; an
out-of-memory call resets that count. Calls smaller than the limit prove nothing about it and
do not count, so under light traffic the limit stays where it is, which costs nothing then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from services.model_server.errors import ModelUnavailable, QueueFull
from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ServingError
from udfserve.runtime.model_config import DEFAULT_QUEUE_BATCHES, BatchingConfig

logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
PredictFn = Callable[[Arrays], Mapping[str, np.ndarray]]

LIMIT_RECOVERY_CALLS = 64
"""Successful calls of the full batch limit, in a row, before the limit grows one step."""
LIMIT_RECOVERY_STEPS = 16
"""The limit grows by ``max_batch_size // LIMIT_RECOVERY_STEPS`` rows per step (at least one)."""


class BatchObserver(Protocol):
    """Receives the batcher's measurements (the metrics module implements it)."""

    def on_queue_wait(self, model: str, seconds: float) -> None:
        """One queued chunk waited ``seconds`` from being queued to the start of its batch."""

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        """One backend call ran ``rows`` rows from ``requests`` chunks in ``seconds``; it failed
        unless ``succeeded`` (its rows then run again, split or alone)."""


@runtime_checkable
class AnswerObserver(Protocol):
    """Optionally also implemented by an observer: each request the batcher answered."""

    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        """One request got its outputs: ``compute_s`` in the successful backend calls that ran its
        rows (each call once, however many of its pieces it ran), ``queue_s`` the rest of its time
        in the batcher (waiting for its batch, handoffs, failed calls)."""


@runtime_checkable
class MemoryObserver(Protocol):
    """Optionally also implemented by an observer: out-of-memory splits and the batch limit."""

    def on_out_of_memory(self, model: str, rows: int) -> None:
        """A backend call of ``rows`` rows ran out of memory; split in halves when ``rows`` > 1."""

    def on_batch_limit(self, model: str, rows: int) -> None:
        """The batch limit is now ``rows`` (reported at start and on every change)."""


@dataclass(eq=False)
class _Chunk:
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
    queued: bool = field(default=True)
    compute_s: float = 0.0
    """Time in the successful backend calls that ran this chunk's rows, so far."""
    queued_at_pc: float = 0.0
    """``time.perf_counter()`` when queued, the clock of the calls' durations (an event loop's
    ``time()`` may be that of the start of its current iteration, as uvloop's is)."""


@dataclass
class _CallResult:
    outputs: Arrays | None
    error: BaseException | None
    seconds: float


@dataclass
class _Piece:
    """Rows ``start:stop`` of a batch, run in one backend call: their outputs or its error."""

    start: int
    stop: int
    outputs: Arrays | None
    error: BaseException | None
    seconds: float = 0.0
    """The call's duration."""


def _set_exception(future: asyncio.Future[Arrays], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _unfittable(piece: _Piece) -> bool:
    """A single row that ran out of memory alone: its size, not the batch's, is at fault."""
    return isinstance(piece.error, DeviceOutOfMemory) and piece.stop - piece.start == 1


def _parts_of_pieces(pieces: list[_Piece], start: int, stop: int) -> list[Arrays]:
    """The outputs of rows ``start:stop`` of a batch, one part per successful piece covering them."""
    parts = []
    for piece in pieces:
        assert piece.outputs is not None
        lo, hi = max(start, piece.start) - piece.start, min(stop, piece.stop) - piece.start
        parts.append({name: array[lo:hi] for name, array in piece.outputs.items()})
    return parts


def _signature(inputs: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """Requests merge only when every array agrees on dtype and per-row shape."""
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(inputs.items()))


@dataclass(eq=False)
class _Batch:
    """Chunks taken from the queue and run together; ``call`` or ``task`` is what runs them."""

    chunks: list[_Chunk]
    rows: int
    inputs: Arrays
    task: asyncio.Task[None] | None = None


class DynamicBatcher:
    """One model's queue and the batches it runs.

    ``max_queue_rows`` defaults to ``config.max_queue_rows``, else 64 x ``max_batch_size``
    (the same rule as ``ModelConfig.max_queue_rows``).
    """

    def __init__(
        self,
        model_name: str,
        predict: PredictFn,
        *,
        max_batch_size: int,
        config: BatchingConfig,
        executor: concurrent.futures.Executor,
        observer: BatchObserver | None = None,
        max_concurrent_batches: int = 1,
        max_queue_rows: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, received {max_batch_size}")
        if max_concurrent_batches < 1:
            raise ValueError(f"max_concurrent_batches must be at least 1, received {max_concurrent_batches}")
        self.model_name = model_name
        self._predict = predict
        self._max_batch_size = max_batch_size
        self._config = config
        self._delay_s = config.max_queue_delay_s
        self._executor = executor
        self._observer = observer
        self._memory_observer = observer if isinstance(observer, MemoryObserver) else None
        self._answer_observer = observer if isinstance(observer, AnswerObserver) else None
        self._batch_limit = max_batch_size
        self._full_calls_at_limit = 0
        self._max_concurrent_batches = max_concurrent_batches
        self._max_queue_rows = (
            max_queue_rows or config.max_queue_rows or DEFAULT_QUEUE_BATCHES * max_batch_size
        )
        self._queue: deque[_Chunk] = deque()
        self._queued_rows = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatch_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_s = 0.0
        self._running: set[_Batch] = set()
        self._drained: asyncio.Future[None] | None = None
        self._stopping = False
        self._closed = False
        self._broken = False
        self._requests_queued = 0
        self._awaited = 0
        """Requests expected back: how many the last finished batch merged (0 once one started)."""
        self._awaited_after = 0
        """``_requests_queued`` when that batch finished: later requests count as coming back."""
        self._awaited_until_s = float("-inf")
        """When waiting for them stops: the batch's finish plus ``max_queue_delay_s``."""
        self.batches_started = 0
        """Batches started so far (the backend calls of out-of-memory splits not counted)."""
        self.batches_started_at_once = 0
        """Of them, batches started at once by a request that found the batcher idle."""

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (not counting the batches running)."""
        return self._queued_rows

    @property
    def max_queue_rows(self) -> int:
        return self._max_queue_rows

    @property
    def batch_limit(self) -> int:
        """The most rows one backend call runs now: ``max_batch_size`` until the backend ran out
        of memory, then lower until it recovers."""
        return self._batch_limit

    def start(self) -> None:
        """Serve requests on the running event loop."""
        if self._loop is not None:
            raise RuntimeError(f"batcher of model '{self.model_name}' is already started")
        self._loop = asyncio.get_running_loop()
        self._report_limit()

    async def submit(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Queue one request and return its outputs, each with the request's row count."""
        return await self.enqueue(inputs)

    def enqueue(self, inputs: dict[str, np.ndarray]) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue one request now and return the future of its outputs, for callers that answer
        from a callback rather than a task. Cancelling the future drops what has not run yet.
        Refusals (``QueueFull``, ``ModelUnavailable``, ``ValueError``) are raised here."""
        if self._stopping:
            raise ModelUnavailable(f"model '{self.model_name}' is shutting down; retry on another server")
        if self._loop is None:
            raise RuntimeError(f"batcher of model '{self.model_name}' is not started")
        if self._broken:
            raise ModelUnavailable(f"model '{self.model_name}': batcher failed; retry on another server")
        rows = self._rows_of(inputs)
        if self._queued_rows > 0 and self._queued_rows + rows > self._max_queue_rows:
            raise QueueFull(
                f"model '{self.model_name}': queue full: {self._queued_rows} rows queued, this request "
                f"has {rows}, the limit is {self._max_queue_rows} rows; retry later"
            )
        chunks = self._queue_chunks(inputs, rows)
        if len(chunks) == 1:
            return chunks[0].future
        return self._whole(chunks)

    async def stop(self, grace_period_s: float) -> None:
        """Refuse new requests, finish the queued and running ones within ``grace_period_s``,
        then answer whatever is left with ``ModelUnavailable``."""
        self._stopping = True
        loop = self._loop
        if loop is None or self._closed:
            return
        self._dispatch()  # the delay no longer applies: whatever is queued starts as slots free
        if self._queue or self._running:
            self._drained = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), timeout=grace_period_s)
            except TimeoutError:
                logger.warning(
                    "model '%s': grace period of %.1f s over with %d rows queued and %d batches running; "
                    "cancelling them",
                    self.model_name,
                    grace_period_s,
                    self._queued_rows,
                    len(self._running),
                )
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        running, self._running = self._running, set()
        unanswered = [*self._queue, *(chunk for batch in running for chunk in batch.chunks)]
        tasks = [batch.task for batch in running if batch.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail(unanswered, ModelUnavailable(f"model '{self.model_name}' shut down before answering"))

    # -- queueing ---------------------------------------------------------------------------------

    @staticmethod
    def _rows_of(inputs: Mapping[str, np.ndarray]) -> int:
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

    def _queue_chunks(self, inputs: Arrays, rows: int) -> list[_Chunk]:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        queued_at_pc = time.perf_counter()
        signature = _signature(inputs)
        limit = self._batch_limit
        self._requests_queued += 1
        request = self._requests_queued
        at_once = not self._queue and not self._running and not self._awaiting(now)
        if rows <= limit:
            chunks = [_Chunk(inputs, rows, signature, loop.create_future(), now, 0, rows, request, at_once)]
        else:
            chunks = [
                _Chunk(
                    {name: array[start : start + limit] for name, array in inputs.items()},
                    min(limit, rows - start),
                    signature,
                    loop.create_future(),
                    now,
                    start,
                    rows,
                    request,
                    at_once,
                )
                for start in range(0, rows, limit)
            ]
        for chunk in chunks:
            chunk.queued_at_pc = queued_at_pc
            chunk.future.add_done_callback(self._on_queued_chunk_done)
        self._queue.extend(chunks)
        self._queued_rows += rows
        self._wake(at_once)
        return chunks

    def _awaiting(self, now_s: float) -> bool:
        """Whether the clients of the last merged batch are still expected back (see the module's
        docstring: the returning cohort)."""
        return self._awaited > 1 and now_s < self._awaited_until_s and not self._cohort_back()

    def _due_at_s(self, head: _Chunk, now_s: float) -> float:
        """When a batch that can still grow starts if nothing fills it: its oldest request's
        delay, or later while the last merged batch's clients are expected back."""
        due_at_s = head.enqueued_at_s + self._delay_s
        if self._awaiting(now_s):
            return max(due_at_s, self._awaited_until_s)
        return due_at_s

    def _cohort_back(self) -> bool:
        """Whether as many requests arrived since the last merged batch finished as it held."""
        return self._awaited > 1 and self._requests_queued - self._awaited_after >= self._awaited

    def _wake(self, at_once: bool) -> None:
        """After a request was queued: look for a batch to start when one could be due."""
        if len(self._running) >= self._max_concurrent_batches:
            return  # the batch that finishes first starts the next one
        due = at_once or self._queued_rows >= self._batch_limit or self._cohort_back()
        if due or not self._config.enabled:
            if self._dispatch_handle is None:
                assert self._loop is not None
                self._dispatch_handle = self._loop.call_soon(self._dispatch_soon)
        elif self._timer is None:
            assert self._loop is not None
            self._arm_timer(self._due_at_s(self._queue[0], self._loop.time()))

    def _whole(self, chunks: list[_Chunk]) -> asyncio.Future[Arrays]:
        """One future for the chunks of a request cut to the batch limit: their outputs joined in
        order, or the first failure; cancelling it, or a failure, cancels the chunks not run."""
        assert self._loop is not None
        whole: asyncio.Future[Arrays] = self._loop.create_future()
        pending = [len(chunks)]

        def on_chunk_done(future: asyncio.Future[Arrays]) -> None:
            if whole.done():
                return
            if future.cancelled():
                whole.cancel()
                return
            error = future.exception()
            if error is not None:
                whole.set_exception(error)
                return
            pending[0] -= 1
            if pending[0] == 0:
                try:
                    joined = self._joined([chunk.future.result() for chunk in chunks], chunks[0].request_rows)
                except InvalidInput as refusal:
                    whole.set_exception(refusal)
                    return
                whole.set_result(joined)
                self._report_answered(chunks)

        def on_whole_done(_whole: asyncio.Future[Arrays]) -> None:
            for chunk in chunks:
                chunk.future.cancel()

        for chunk in chunks:
            chunk.future.add_done_callback(on_chunk_done)
        whole.add_done_callback(on_whole_done)
        return whole

    def _on_queued_chunk_done(self, future: asyncio.Future[Arrays]) -> None:
        """A chunk cancelled while queued leaves the queue at once, freeing its rows (the callback
        is removed when a chunk is taken into a batch)."""
        for chunk in self._queue:
            if chunk.future is future:
                self._queue.remove(chunk)
                chunk.queued = False
                self._queued_rows -= chunk.rows
                self._resolve_drained()
                return

    def _take(self, batch: list[_Chunk]) -> None:
        queue = self._queue
        if all(queued is chunk for queued, chunk in zip(queue, batch, strict=False)):
            for _ in batch:
                queue.popleft()
        else:
            taken = set(batch)
            self._queue = deque(chunk for chunk in queue if chunk not in taken)
        for chunk in batch:
            chunk.queued = False
            self._queued_rows -= chunk.rows
            chunk.future.remove_done_callback(self._on_queued_chunk_done)

    def _candidates(self) -> tuple[list[_Chunk], bool]:
        """The batch the oldest chunk would run in now, and whether it can still grow. Chunks
        cancelled whose callback has not run yet are passed over."""
        limit = self._batch_limit
        head: _Chunk | None = None
        batch: list[_Chunk] = []
        rows = 0
        for chunk in self._queue:
            if chunk.future.done():
                continue
            if head is None:
                head = chunk
                if not self._config.enabled:
                    return [chunk], False
            elif chunk.signature != head.signature:
                continue
            # The head always runs, even when queued before the limit dropped below its size.
            if batch and rows + chunk.rows > limit:
                return batch, False
            batch.append(chunk)
            rows += chunk.rows
        return batch, rows < limit

    # -- dispatching ------------------------------------------------------------------------------

    def _dispatch_soon(self) -> None:
        self._dispatch_handle = None
        self._dispatch()

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _arm_timer(self, at_s: float) -> None:
        if self._timer is not None:
            if self._timer_at_s <= at_s:
                return  # an earlier check comes first and arms the next one
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at_s = at_s
        self._timer = self._loop.call_at(at_s, self._on_timer)

    def _dispatch(self) -> None:
        """Start every batch that is due while slots are free: at once for a request that found the
        batcher idle; else when the batch is full, the last merged batch's clients are back, or
        its oldest request has waited ``max_queue_delay_s`` (and they are no longer awaited)."""
        if self._closed:
            return
        try:
            self._start_due_batches()
        except Exception:
            logger.exception("model '%s': batcher failed", self.model_name)
            self._broken = True
            unanswered = [*self._queue, *(chunk for batch in self._running for chunk in batch.chunks)]
            self._fail(unanswered, ModelUnavailable(f"model '{self.model_name}': batcher failed"))
        self._resolve_drained()

    def _resolve_drained(self) -> None:
        """Wake a ``stop`` waiting for the batcher to empty, once nothing is queued or running."""
        drained = self._drained
        if drained is not None and not drained.done() and not self._queue and not self._running:
            drained.set_result(None)

    def _start_due_batches(self) -> None:
        assert self._loop is not None
        while self._queue and len(self._running) < self._max_concurrent_batches:
            chunks, can_grow = self._candidates()
            if not chunks:
                return
            at_once = chunks[0].at_once
            if can_grow and not at_once and not self._stopping and not self._cohort_back():
                now_s = self._loop.time()
                due_at_s = self._due_at_s(chunks[0], now_s)
                if due_at_s > now_s:
                    self._arm_timer(due_at_s)
                    return
            self._awaited = 0
            self._take(chunks)
            self.batches_started += 1
            self.batches_started_at_once += at_once
            self._start(chunks)

    # -- running ----------------------------------------------------------------------------------

    def _start(self, chunks: list[_Chunk]) -> None:
        """Start one batch. The common case, one call within the batch limit that succeeds, is
        answered from the call's completion callback; anything else continues in a task."""
        loop = self._loop
        assert loop is not None
        started_s = loop.time()
        for chunk in chunks:
            self._observe_wait(started_s - chunk.enqueued_at_s)
        if len(chunks) == 1:
            inputs = chunks[0].inputs
        else:
            inputs = {name: np.concatenate([c.inputs[name] for c in chunks]) for name in chunks[0].inputs}
        rows = sum(chunk.rows for chunk in chunks)
        batch = _Batch(chunks, rows, inputs)
        self._running.add(batch)
        if rows > self._batch_limit:  # queued before the limit dropped: several calls
            batch.task = loop.create_task(self._run_batch(batch, None))
            return
        call = self._executor.submit(self._call_backend, inputs, rows)
        call.add_done_callback(functools.partial(self._call_finished, loop, batch))

    def _call_finished(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: _Batch,
        call: concurrent.futures.Future[_CallResult],
    ) -> None:
        """Runs in the executor's thread: hand the result to the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the answer
            loop.call_soon_threadsafe(self._on_call_done, batch, call)

    def _on_call_done(self, batch: _Batch, call: concurrent.futures.Future[_CallResult]) -> None:
        if batch not in self._running:
            return  # stopped after the grace period: its requests were answered already
        try:
            result = call.result()
        except Exception as error:  # _call_backend never raises; the executor might
            result = _CallResult(None, error, 0.0)
        self._report_batch(batch.rows, len(batch.chunks), result)
        if result.error is not None:
            assert self._loop is not None
            batch.task = self._loop.create_task(self._run_batch(batch, result))
            return
        self._on_success(batch.rows)
        outputs = result.outputs
        assert outputs is not None
        if len(batch.chunks) == 1:
            self._resolve(batch.chunks[0], outputs, result.seconds)
        else:
            start = 0
            for chunk in batch.chunks:
                stop = start + chunk.rows
                self._resolve(
                    chunk, {name: array[start:stop] for name, array in outputs.items()}, result.seconds
                )
                start = stop
        self._finish(batch)

    def _finish(self, batch: _Batch) -> None:
        if batch in self._running:
            self._running.discard(batch)
            assert self._loop is not None
            self._awaited = len({chunk.request for chunk in batch.chunks})
            self._awaited_after = self._requests_queued
            self._awaited_until_s = self._loop.time() + self._delay_s
            self._dispatch()

    def _fail(self, chunks: list[_Chunk], error: ServingError) -> None:
        for chunk in chunks:
            chunk.queued = False
            _set_exception(chunk.future, error)
        self._queue.clear()
        self._queued_rows = 0

    async def _run_batch(self, batch: _Batch, first: _CallResult | None) -> None:
        """The batch's rows in calls of the batch limit, splitting on out-of-memory, and each
        request of a failed merged call again alone; ``first`` is the failed whole-batch call."""
        try:
            chunks = batch.chunks
            bounds = np.cumsum([0, *(chunk.rows for chunk in chunks)])
            pieces = await self._run_range(batch.inputs, bounds, 0, batch.rows, first)
            isolate = self._answer(chunks, pieces)
            if isolate:
                logger.warning(
                    "model '%s': a merged batch of %d requests failed (%s); running each alone",
                    self.model_name,
                    len(isolate),
                    next(piece.error for piece in pieces if piece.error is not None),
                )
                for chunk in isolate:
                    if not chunk.future.done():
                        self._answer([chunk], await self._run_rows([chunk]))
        except Exception:
            logger.exception("model '%s': running a batch failed", self.model_name)
            error = BackendFault(f"model '{self.model_name}': running the batch failed; see the server log")
            for chunk in batch.chunks:
                _set_exception(chunk.future, error)
        finally:
            self._finish(batch)

    def _answer(self, chunks: list[_Chunk], pieces: list[_Piece]) -> list[_Chunk]:
        """Answer every chunk from the pieces covering its rows; return the chunks that share a
        failed call with other chunks and must be run alone to tell which of them is at fault."""
        isolate = []
        start = 0
        for chunk in chunks:
            stop = start + chunk.rows
            covering = [piece for piece in pieces if piece.start < stop and piece.stop > start]
            failed = next((piece for piece in covering if piece.error is not None), None)
            if failed is None:
                try:
                    outputs = self._joined(_parts_of_pieces(covering, start, stop), chunk.request_rows)
                except InvalidInput as error:
                    _set_exception(chunk.future, error)
                else:
                    self._resolve(chunk, outputs, sum(p.seconds for p in covering))
            elif len(chunks) > 1 and (failed.start < start or failed.stop > stop):
                isolate.append(chunk)
            else:
                assert failed.error is not None
                _set_exception(chunk.future, self._chunk_error(chunk, failed, start))
            start = stop
        return isolate

    def _joined(self, parts: list[Arrays], request_rows: int) -> Arrays:
        """One request's outputs from the calls its rows ran in, in row order.

        A model whose output shape depends on the rows it is given (text padded to its longest
        row, say) can answer two calls with rows of different shapes; those cannot be one answer.
        """
        if len(parts) == 1:
            return parts[0]
        joined = {}
        for name in parts[0]:
            arrays = [part[name] for part in parts]
            shapes = sorted({array.shape[1:] for array in arrays})
            if len(shapes) > 1:
                raise InvalidInput(
                    f"model '{self.model_name}': output {name!r} came back with rows of shape "
                    f"{' and '.join(map(str, shapes))} from the calls this request's {request_rows} rows "
                    f"ran in (the model runs at most {self._batch_limit} rows at once, and a call that "
                    "runs out of memory is split); an output whose shape depends on the rows it is "
                    f"computed with cannot be joined: send at most {self._batch_limit} rows per request, "
                    "or give the output a fixed shape"
                )
            joined[name] = np.concatenate(arrays)
        return joined

    def _chunk_error(self, chunk: _Chunk, failed: _Piece, chunk_start: int) -> ServingError:
        error = failed.error
        if isinstance(error, DeviceOutOfMemory) and failed.stop - failed.start == 1:
            row = chunk.first_row + failed.start - chunk_start
            return DeviceOutOfMemory(
                f"model '{self.model_name}': out of memory on a single row: row {row} of the request's "
                f"{chunk.request_rows} rows does not fit even alone (its batch was split down to one "
                f"row); retry later or on another device. Backend: {error.message}"
            )
        assert error is not None
        return self._as_serving_error(error)

    async def _run_rows(self, chunks: list[_Chunk]) -> list[_Piece]:
        """Run the chunks' rows as one batch; the pieces returned cover every row, in order."""
        if len(chunks) == 1:
            inputs = chunks[0].inputs
        else:
            inputs = {name: np.concatenate([c.inputs[name] for c in chunks]) for name in chunks[0].inputs}
        bounds = np.cumsum([0, *(chunk.rows for chunk in chunks)])
        return await self._run_range(inputs, bounds, 0, int(bounds[-1]))

    async def _run_range(
        self, inputs: Arrays, bounds: np.ndarray, start: int, stop: int, first: _CallResult | None = None
    ) -> list[_Piece]:
        """Rows ``start:stop`` in one call, or in calls of the batch limit when they exceed it
        (chunks queued before the limit dropped); on out-of-memory, the two halves, recursively.
        ``first``, when given, is the outcome of the call of exactly these rows, already made."""
        rows = stop - start
        if rows > self._batch_limit:
            pieces: list[_Piece] = []
            while start < stop:  # the limit is read again before each call: it may drop meanwhile
                end = min(start + self._batch_limit, stop)
                pieces.extend(await self._run_range(inputs, bounds, start, end))
                start = end
            return pieces
        whole = start == 0 and stop == int(bounds[-1])
        part = inputs if whole else {name: array[start:stop] for name, array in inputs.items()}
        first_chunk = int(np.searchsorted(bounds, start, side="right")) - 1
        last_chunk = int(np.searchsorted(bounds, stop, side="left")) - 1
        result = first if first is not None else await self._call(part, rows, last_chunk - first_chunk + 1)
        if result.error is None:
            self._on_success(rows)
            return [_Piece(start, stop, result.outputs, None, result.seconds)]
        if not isinstance(result.error, DeviceOutOfMemory):
            return [_Piece(start, stop, None, result.error)]
        self._on_out_of_memory(rows)
        if rows == 1:
            return [_Piece(start, stop, None, result.error)]
        middle = start + (rows + 1) // 2
        pieces = [
            *await self._run_range(inputs, bounds, start, middle),
            *await self._run_range(inputs, bounds, middle, stop),
        ]
        succeeded = [piece.stop - piece.start for piece in pieces if piece.error is None]
        if succeeded and not any(_unfittable(piece) for piece in pieces):
            # The size explains this call's failure (no row in it fails alone): later batches
            # start from the largest part of it that fitted.
            self._lower_limit(max(succeeded))
        return pieces

    # -- batch limit ------------------------------------------------------------------------------

    def _on_out_of_memory(self, rows: int) -> None:
        logger.warning(
            "model '%s': out of memory on a call of %d rows; %s",
            self.model_name,
            rows,
            "splitting it in halves" if rows > 1 else "a single row does not fit",
        )
        if self._memory_observer is not None:
            try:
                self._memory_observer.on_out_of_memory(self.model_name, rows)
            except Exception:
                logger.exception("model '%s': batch observer failed", self.model_name)
        self._full_calls_at_limit = 0

    def _lower_limit(self, rows: int) -> None:
        if rows >= self._batch_limit:
            return
        self._batch_limit = rows
        self._full_calls_at_limit = 0
        logger.warning("model '%s': batch limit lowered to %d rows", self.model_name, rows)
        self._report_limit()

    def _on_success(self, rows: int) -> None:
        if self._batch_limit >= self._max_batch_size or rows < self._batch_limit:
            return
        self._full_calls_at_limit += 1
        if self._full_calls_at_limit < LIMIT_RECOVERY_CALLS:
            return
        self._full_calls_at_limit = 0
        step = max(1, self._max_batch_size // LIMIT_RECOVERY_STEPS)
        self._batch_limit = min(self._max_batch_size, self._batch_limit + step)
        logger.info("model '%s': batch limit raised to %d rows", self.model_name, self._batch_limit)
        self._report_limit()

    def _report_limit(self) -> None:
        if self._memory_observer is None:
            return
        try:
            self._memory_observer.on_batch_limit(self.model_name, self._batch_limit)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    async def _call(self, inputs: Arrays, rows: int, requests: int) -> _CallResult:
        """One backend call in the executor, reported to the observer."""
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self._call_backend, inputs, rows)
        self._report_batch(rows, requests, result)
        return result

    def _resolve(self, chunk: _Chunk, outputs: Arrays, compute_s: float) -> None:
        """Answer ``chunk`` with outputs of calls that took ``compute_s`` in all; a chunk that is its
        whole request is reported here (a request cut into chunks, once they all are: ``_whole``)."""
        if chunk.future.done():
            return  # cancelled: its client went away
        chunk.compute_s += compute_s
        chunk.future.set_result(outputs)
        if chunk.rows == chunk.request_rows:
            self._report_answered([chunk])

    def _report_answered(self, chunks: list[_Chunk]) -> None:
        """One request's chunks were all answered: its time in the batcher, split."""
        if self._answer_observer is None:
            return
        compute_s = sum(chunk.compute_s for chunk in chunks)
        in_batcher_s = time.perf_counter() - chunks[0].queued_at_pc
        try:
            self._answer_observer.on_request_answered(
                self.model_name, max(0.0, in_batcher_s - compute_s), compute_s
            )
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def _report_batch(self, rows: int, requests: int, result: _CallResult) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_batch(self.model_name, rows, requests, result.seconds, result.error is None)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def _call_backend(self, inputs: Arrays, rows: int) -> _CallResult:
        """Runs in the executor; never raises, so the event loop sees one kind of answer."""
        started_s = time.perf_counter()
        try:
            outputs = dict(self._predict(inputs))
            self._check_outputs(outputs, rows)
        except Exception as error:
            return _CallResult(None, error, time.perf_counter() - started_s)
        return _CallResult(outputs, None, time.perf_counter() - started_s)

    def _check_outputs(self, outputs: Arrays, rows: int) -> None:
        for name, array in outputs.items():
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise BackendFault(
                    f"model '{self.model_name}': backend output '{name}' is {type(array).__name__} "
                    f"{getattr(array, 'shape', '')}; expected an array with {rows} rows"
                )
            if array.shape[0] != rows:
                raise BackendFault(
                    f"model '{self.model_name}': backend output '{name}' has {array.shape[0]} rows; "
                    f"expected {rows}, one per input row of the batch"
                )

    def _as_serving_error(self, error: BaseException) -> ServingError:
        if isinstance(error, ServingError):
            return error
        logger.error(
            "model '%s': backend failed", self.model_name, exc_info=(type(error), error, error.__traceback__)
        )
        return BackendFault(f"model '{self.model_name}': backend failed: {type(error).__name__}: {error}")

    def _observe_wait(self, seconds: float) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_queue_wait(self.model_name, seconds)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)
