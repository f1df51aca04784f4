"""The dynamic batcher of one model: its parts put together, and its lifecycle.

``DynamicBatcher`` admits a request into its ``RequestQueue`` (queue.py), lets the ``Dispatcher``
(dispatch.py) decide when a batch starts, and hands each batch to the ``BatchRunner``
(runner.py), which answers it under the ``RowLimit`` (row_limit.py). What it owns itself: start,
the refusals of a stopping or failed batcher, and the drain that ``stop`` waits for.

- Refusals (``QueueFull``, ``ModelUnavailable``, ``ValueError``) are raised by ``enqueue``, before
  anything of the request is queued.
- A request whose caller went away (its future was cancelled) is dropped before it runs.
- ``stop`` refuses new requests, lets the queued and running ones finish within its grace period
  (the delay no longer applies), then answers the rest with ``ModelUnavailable``.
- If dispatching itself fails (a fault of the batcher, not of the backend: no thread can be
  started for a call, no memory for a merged batch), the batcher is broken for good: every
  queued and running request is answered ``ModelUnavailable`` at once, so is every later one,
  and ``on_broken`` is told why, once; the server then stops serving and exits, for its
  supervisor to start a fresh process (``app.serve``). A model call that ran past its bound
  (``call_bound_s``) and that its backend could not stop breaks the batcher the same way: its
  thread is lost to the model until the process ends (``udfserve.runtime.call_bound``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

import numpy as np

from udfserve.runtime.errors import ServingError
from udfserve.runtime.model_config import DEFAULT_QUEUE_BATCHES, BatchingConfig
from udfserve.services.model_server.core.batching.admission import RoomWaits, WaitingRequest
from udfserve.services.model_server.core.batching.answers import set_exception, whole_request
from udfserve.services.model_server.core.batching.dispatch import Dispatcher
from udfserve.services.model_server.core.batching.observers import BatchObserver, Reports
from udfserve.services.model_server.core.batching.queue import UNNAMED, Chunk, RequestQueue, Share, rows_of
from udfserve.services.model_server.core.batching.row_limit import RowLimit
from udfserve.services.model_server.core.batching.runner import Batch, BatchRunner, PredictFn
from udfserve.services.model_server.errors import ModelUnavailable, QueueFull

logger = logging.getLogger(__name__)


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
        max_flows: int = 64,
        on_broken: Callable[[str], None] | None = None,
        call_bound_s: float = 0.0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, received {max_batch_size}")
        if max_concurrent_batches < 1:
            raise ValueError(f"max_concurrent_batches must be at least 1, received {max_concurrent_batches}")
        self.model_name = model_name
        self._reports = Reports(model_name, observer)
        self._limit = RowLimit(max_batch_size, self._reports)
        self._queue = RequestQueue(
            model_name,
            max_queue_rows or config.max_queue_rows or DEFAULT_QUEUE_BATCHES * max_batch_size,
            on_cancelled=self._resolve_drained,
            max_flows=max_flows,
        )
        self._waits = RoomWaits(self._queue, self._queue_admitted, self._reports.room_wait)
        self._running: set[Batch] = set()
        self._runner = BatchRunner(
            model_name,
            predict,
            executor,
            self._limit,
            self._reports,
            self._running,
            self._on_batch_finished,
            call_bound_s=call_bound_s,
            on_stuck=self._break,
        )
        self._dispatcher = Dispatcher(
            config,
            max_concurrent_batches,
            self._queue,
            self._limit,
            self._running,
            start=self._runner.start,
            on_due=self._dispatch,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Future[None] | None = None
        self._stopping = False
        self._closed = False
        self._broken = ""
        """Why the batcher is broken for good; "" while it serves."""
        self._on_broken = on_broken

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (not counting the batches running)."""
        return self._queue.rows

    @property
    def max_queue_rows(self) -> int:
        return self._queue.max_rows

    def queued_rows_by_flow(self) -> dict[str, int]:
        """Rows waiting per application (its flow's key), for the metrics."""
        return {key: flow.rows for key, flow in self._queue.flows.items()}

    @property
    def batch_limit(self) -> int:
        """The most rows one backend call runs now: ``max_batch_size`` until the backend ran out
        of memory, then lower until it recovers."""
        return self._limit.rows

    @property
    def batches_started(self) -> int:
        """Batches started so far (the backend calls of out-of-memory splits not counted)."""
        return self._dispatcher.batches_started

    @property
    def batches_started_at_once(self) -> int:
        """Of them, batches started at once by a request that found the batcher idle."""
        return self._dispatcher.batches_started_at_once

    def start(self) -> None:
        """Serve requests on the running event loop."""
        if self._loop is not None:
            raise RuntimeError(f"batcher of model '{self.model_name}' is already started")
        self._loop = loop = asyncio.get_running_loop()
        self._dispatcher.bind(loop)
        self._runner.bind(loop)
        self._limit.report()

    async def submit(self, inputs: dict[str, np.ndarray], share: Share = UNNAMED) -> dict[str, np.ndarray]:
        """Queue one request and return its outputs, each with the request's row count."""
        return await self.enqueue(inputs, share)

    def enqueue(
        self, inputs: dict[str, np.ndarray], share: Share = UNNAMED
    ) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue one request now, in the flow of ``share``'s application, and return the future of
        its outputs, for callers that answer from a callback rather than a task. Cancelling the
        future drops what has not run yet. Refusals (``QueueFull``, ``ModelUnavailable``,
        ``ValueError``) are raised here."""
        self._check_serving()
        rows = rows_of(inputs)
        self._queue.admit(rows, share)
        return self._queue_admitted(inputs, rows, share)

    def enqueue_or_wait(
        self, inputs: dict[str, np.ndarray], share: Share, max_wait_s: float
    ) -> tuple[asyncio.Future[dict[str, np.ndarray]], asyncio.Future[None] | None]:
        """``enqueue``, except that a request finding its application's share of the queue full
        waits for room, at most ``max_wait_s`` (``admission.RoomWaits``), instead of being refused:
        the future of its outputs, and one done once it was queued or refused (None when queued at
        once), before which its stream reads nothing more. With ``max_wait_s`` 0, ``enqueue``."""
        if max_wait_s <= 0:
            return self.enqueue(inputs, share), None
        self._check_serving()
        rows = rows_of(inputs)
        refusal = self._queue.refusal(rows, share)
        if refusal is None and self._waits.holds_flow_of(share):
            refusal = QueueFull(
                f"model '{self.model_name}': requests of this application already wait for room in the "
                "queue; retry later"
            )
        if refusal is None:
            self._queue.admit(rows, share)
            return self._queue_admitted(inputs, rows, share), None
        waiting: WaitingRequest = self._waits.wait(inputs, rows, share, max_wait_s, refusal)
        return waiting.answer, waiting.admitted

    def _check_serving(self) -> None:
        """Refuse requests while stopping or broken; ``RuntimeError`` before ``start``."""
        if self._stopping:
            raise ModelUnavailable(f"model '{self.model_name}' is shutting down; retry on another server")
        if self._loop is None:
            raise RuntimeError(f"batcher of model '{self.model_name}' is not started")
        if self._broken:
            raise ModelUnavailable(
                f"model '{self.model_name}': its batcher failed ({self._broken}); retry on another server"
            )

    def _queue_admitted(
        self, inputs: dict[str, np.ndarray], rows: int, share: Share
    ) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue a request just admitted, start a batch if one is due, return its outputs' future."""
        loop = self._loop
        assert loop is not None
        now_s = loop.time()
        dispatcher = self._dispatcher
        at_once = dispatcher.idle(now_s)
        chunks = self._queue.put(inputs, rows, self._limit.rows, loop, now_s, at_once, share)
        dispatcher.wake(at_once)
        if len(chunks) == 1:
            return chunks[0].future
        return whole_request(loop, chunks, self._limit, self._reports)

    async def stop(self, grace_period_s: float) -> None:
        """Refuse new requests, finish the queued and running ones within ``grace_period_s``,
        then answer whatever is left with ``ModelUnavailable``."""
        self._stopping = True
        self._waits.refuse_all(
            QueueFull(f"model '{self.model_name}' stopped before it had room for this request; retry later")
        )
        self._dispatcher.drain()
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
                    self._queue.rows,
                    len(self._running),
                )
        self._closed = True
        self._dispatcher.cancel_timer()
        running = list(self._running)
        self._running.clear()  # a call that finishes now finds its batch answered already
        unanswered = [*self._queue.chunks, *(chunk for batch in running for chunk in batch.chunks)]
        tasks = [batch.task for batch in running if batch.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail(unanswered, ModelUnavailable(f"model '{self.model_name}' shut down before answering"))

    def release_model(self) -> None:
        """After ``stop``: let go of the model's predict, so that nothing this batcher's parts
        still hold (they refer to each other) keeps the model's memory."""
        self._runner.release_model()

    def _dispatch(self) -> None:
        """Start the batches that are due; a failure of the batcher itself fails everything it
        holds and refuses what comes after."""
        if self._closed:
            return
        try:
            self._dispatcher.start_due_batches()
        except Exception as error:
            logger.exception("model '%s': batcher failed", self.model_name)
            self._break(f"starting a batch failed: {type(error).__name__}: {error}")
        self._resolve_drained()

    def _break(self, reason: str) -> None:
        """Answer everything held ``ModelUnavailable`` now, refuse what comes, report once.

        The running batches are forgotten too (a call that finishes later finds its batch
        answered), so a drain waits for nothing the batcher holds."""
        if self._broken or self._closed:
            return
        self._broken = reason
        self._dispatcher.cancel_timer()
        running = list(self._running)
        self._running.clear()
        unanswered = [*self._queue.chunks, *(chunk for batch in running for chunk in batch.chunks)]
        refusal = f"model '{self.model_name}': its batcher failed ({reason}); retry on another server"
        self._waits.refuse_all(ModelUnavailable(refusal))
        self._fail(unanswered, ModelUnavailable(refusal))
        if self._on_broken is not None:
            self._on_broken(reason)

    def _on_batch_finished(self, batch: Batch) -> None:
        self._dispatcher.batch_finished(batch.chunks)
        self._dispatch()

    def _resolve_drained(self) -> None:
        """Wake a ``stop`` waiting for the batcher to empty, once nothing is queued or running."""
        drained = self._drained
        if drained is not None and not drained.done() and not self._queue and not self._running:
            drained.set_result(None)

    def _fail(self, chunks: list[Chunk], error: ServingError) -> None:
        for chunk in chunks:
            set_exception(chunk.future, error)
        self._queue.clear()
