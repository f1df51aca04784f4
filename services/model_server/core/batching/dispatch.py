"""When a batch starts. Nothing polls: a request wakes the dispatcher only when a batch could be
due, and a batch that waits has one timer for its delay.

- At once when a request finds the batcher idle (nothing queued, no batch running): a lone
  client never waits for partners that cannot come. The batch merges whatever was queued by the
  time the dispatcher runs (the requests that arrived in the same turn of the event loop).
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
- Once the batcher drains, nothing waits: whatever is queued starts as slots free.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Protocol

from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching.queue import Chunk, RequestQueue
from udfserve.services.model_server.core.batching.row_limit import RowLimit


class Cancellable(Protocol):
    """A callback the clock will run (an ``asyncio.Handle``), until cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the dispatcher needs of the event loop: its time, and callbacks soon or at a time."""

    def time(self) -> float: ...

    def call_soon(self, callback: Callable[[], object]) -> Cancellable: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class ReturningCohort:
    """The clients of the last merged batch, expected back until ``until_s`` (see the module
    docstring). Requests are counted by their numbers in the queue (``RequestQueue.requests``)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.awaited = 0
        """Requests expected back: how many the last finished batch merged (0 once one started)."""
        self.awaited_after = 0
        """The number of the last request when that batch finished: later ones count as back."""
        self.until_s = float("-inf")
        """When waiting for them stops: the batch's finish plus ``max_queue_delay_s``."""

    def batch_finished(self, requests: int, last_request: int, now_s: float) -> None:
        """A batch that merged ``requests`` requests finished at ``now_s``."""
        self.awaited = requests
        self.awaited_after = last_request
        self.until_s = now_s + self.delay_s

    def batch_started(self) -> None:
        self.awaited = 0

    def back(self, last_request: int) -> bool:
        """Whether as many requests arrived since the last merged batch finished as it held."""
        return self.awaited > 1 and last_request - self.awaited_after >= self.awaited

    def awaiting(self, last_request: int, now_s: float) -> bool:
        """Whether the clients of the last merged batch are still expected back."""
        return self.awaited > 1 and now_s < self.until_s and not self.back(last_request)


class Dispatcher:
    """Decides when the batches of one queue start, and starts them through ``start``.

    ``running`` holds the batches running (the runner's); ``on_due`` is called when a batch may be
    due (the batcher dispatches: ``start_due_batches`` behind its own failure handling).
    """

    def __init__(
        self,
        config: BatchingConfig,
        max_concurrent_batches: int,
        queue: RequestQueue,
        limit: RowLimit,
        running: Sized,
        start: Callable[[list[Chunk]], None],
        on_due: Callable[[], None],
    ) -> None:
        self._delay_s = config.max_queue_delay_s
        self._merge = config.enabled
        self._max_concurrent_batches = max_concurrent_batches
        self._queue = queue
        self._limit = limit
        self._running = running
        self._start = start
        self._on_due = on_due
        self.cohort = ReturningCohort(config.max_queue_delay_s)
        self._clock: Clock | None = None
        self._soon: Cancellable | None = None
        self._timer: Cancellable | None = None
        self._timer_at_s = 0.0
        self._draining = False
        self.batches_started = 0
        """Batches started so far (the backend calls of out-of-memory splits not counted)."""
        self.batches_started_at_once = 0
        """Of them, batches started at once by a request that found the batcher idle."""

    def bind(self, clock: Clock) -> None:
        """Take time and schedule callbacks on ``clock`` (the batcher's event loop, once started)."""
        self._clock = clock

    def drain(self) -> None:
        """From now on nothing waits for the delay or for a cohort."""
        self._draining = True

    def idle(self, now_s: float) -> bool:
        """Whether a request queued now starts a batch at once: nothing is queued or running, and
        no cohort is expected back. Called after the request was admitted, before it is queued."""
        return not self._queue and not self._running and not self.cohort.awaiting(self._queue.requests, now_s)

    def wake(self, at_once: bool) -> None:
        """After a request was queued: look for a batch to start when one could be due."""
        if len(self._running) >= self._max_concurrent_batches:
            return  # the batch that finishes first starts the next one
        queue = self._queue
        due = at_once or queue.rows >= self._limit.rows or self.cohort.back(queue.requests)
        if due or not self._merge:
            if self._soon is None:
                assert self._clock is not None
                self._soon = self._clock.call_soon(self._on_soon)
        elif self._timer is None:
            assert self._clock is not None
            self._arm_timer(self._due_at_s(queue.oldest(), self._clock.time()))

    def batch_finished(self, chunks: list[Chunk]) -> None:
        """A batch of these chunks was answered: its requests' clients are expected back."""
        assert self._clock is not None
        self.cohort.batch_finished(
            len({chunk.request for chunk in chunks}), self._queue.requests, self._clock.time()
        )

    def start_due_batches(self) -> None:
        """Start every batch that is due while slots are free: at once for a request that found the
        batcher idle; else when the batch is full, the last merged batch's clients are back, or
        its oldest request has waited ``max_queue_delay_s`` (and they are no longer awaited)."""
        clock = self._clock
        assert clock is not None
        queue = self._queue
        while queue and len(self._running) < self._max_concurrent_batches:
            chunks, can_grow = queue.candidates(self._limit.rows, self._merge)
            if not chunks:
                return
            at_once = chunks[0].at_once
            if can_grow and not at_once and not self._draining and not self.cohort.back(queue.requests):
                now_s = clock.time()
                due_at_s = self._due_at_s(chunks[0], now_s)
                if due_at_s > now_s:
                    self._arm_timer(due_at_s)
                    return
            self.cohort.batch_started()
            queue.take(chunks)
            self.batches_started += 1
            self.batches_started_at_once += at_once
            self._start(chunks)

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _due_at_s(self, head: Chunk, now_s: float) -> float:
        """When a batch that can still grow starts if nothing fills it: its oldest request's
        delay, or later while the last merged batch's clients are expected back."""
        due_at_s = head.enqueued_at_s + self._delay_s
        cohort = self.cohort
        if cohort.awaiting(self._queue.requests, now_s):
            return max(due_at_s, cohort.until_s)
        return due_at_s

    def _on_soon(self) -> None:
        self._soon = None
        self._on_due()

    def _on_timer(self) -> None:
        self._timer = None
        self._on_due()

    def _arm_timer(self, at_s: float) -> None:
        if self._timer is not None:
            if self._timer_at_s <= at_s:
                return  # an earlier check comes first and arms the next one
            self._timer.cancel()
        assert self._clock is not None
        self._timer_at_s = at_s
        self._timer = self._clock.call_at(at_s, self._on_timer)
