"""When a batch starts, decided by the dispatcher on an explicit clock: no event loop runs, time
moves only when a test moves it, so every due time is checked exactly and nothing sleeps.

The dispatcher sees the event loop through ``Clock`` (its time, ``call_soon``, ``call_at``);
``ManualClock`` below is that clock with time in the test's hands. Batches it starts are recorded
and stay running until the test finishes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching.dispatch import Dispatcher, ReturningCohort
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Chunk, RequestQueue
from udfserve.services.model_server.core.batching.row_limit import RowLimit

DELAY_S = 1.0


@dataclass
class Callback:
    callback: Callable[[], object]
    at_s: float | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ManualClock:
    """The event loop as the dispatcher sees it; callbacks run when the test says so."""

    now_s: float = 0.0
    soon: list[Callback] = field(default_factory=list)
    timers: list[Callback] = field(default_factory=list)

    def time(self) -> float:
        return self.now_s

    def call_soon(self, callback: Callable[[], object]) -> Callback:
        handle = Callback(callback)
        self.soon.append(handle)
        return handle

    def call_at(self, when: float, callback: Callable[[], object]) -> Callback:
        handle = Callback(callback, when)
        self.timers.append(handle)
        return handle

    @property
    def armed(self) -> list[float]:
        """The due times of the timers that have neither run nor been cancelled."""
        return [timer.at_s for timer in self.timers if not timer.cancelled and timer.at_s is not None]

    def run_soon(self) -> None:
        ready, self.soon = self.soon, []
        for handle in ready:
            if not handle.cancelled:
                handle.callback()

    def advance_to(self, now_s: float) -> None:
        """Move time on and run the timers due by then, earliest first."""
        self.now_s = now_s
        while due := sorted(
            (t for t in self.timers if not t.cancelled and t.at_s is not None and t.at_s <= now_s),
            key=lambda t: t.at_s or 0.0,
        ):
            due[0].cancelled = True  # ran: no longer armed
            due[0].callback()


class Batches:
    """A dispatcher over a real queue and limit, on a ``ManualClock``; started batches are recorded
    as the values of their rows and stay running until ``finish``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        max_batch_size: int = 4,
        enabled: bool = True,
        max_concurrent_batches: int = 1,
    ) -> None:
        self.loop = loop
        self.clock = ManualClock()
        self.queue = RequestQueue("m", 1000, on_cancelled=lambda: None)
        self.limit = RowLimit(max_batch_size, Reports("m", None))
        self.running: list[list[Chunk]] = []
        self.started: list[list[float]] = []
        self.dispatcher = Dispatcher(
            BatchingConfig(enabled=enabled, max_queue_delay_s=DELAY_S),
            max_concurrent_batches,
            self.queue,
            self.limit,
            self.running,
            start=self._start,
            on_due=lambda: self.dispatcher.start_due_batches(),
        )
        self.dispatcher.bind(self.clock)

    def _start(self, chunks: list[Chunk]) -> None:
        self.running.append(chunks)
        self.started.append([value for chunk in chunks for value in chunk.inputs["x"].tolist()])

    def submit(self, *values: float) -> None:
        """What ``DynamicBatcher.enqueue`` does with a request: admit, queue, wake."""
        rows = len(values)
        now_s = self.clock.time()
        self.queue.admit(rows)
        at_once = self.dispatcher.idle(now_s)
        inputs = {"x": np.array(values, dtype=np.float32)}
        self.queue.put(inputs, rows, self.limit.rows, self.loop, now_s, at_once)
        self.dispatcher.wake(at_once)

    def finish(self, index: int = 0) -> None:
        """The running batch ``index`` was answered."""
        chunks = self.running.pop(index)
        self.dispatcher.batch_finished(chunks)
        self.dispatcher.start_due_batches()

    def run_merged_batch(self, *values: float) -> None:
        """One batch of one-row requests for ``values``, started and finished now."""
        for value in values:
            self.submit(value)
        self.clock.run_soon()
        self.finish()


# -- the returning cohort, alone ------------------------------------------------------------------


def test_a_cohort_is_back_once_as_many_requests_arrived_as_its_batch_merged() -> None:
    cohort = ReturningCohort(DELAY_S)
    cohort.batch_finished(requests=3, last_request=10, now_s=5.0)
    assert not cohort.back(last_request=12)
    assert cohort.back(last_request=13)


def test_a_cohort_is_awaited_until_the_delay_after_its_batch_finished() -> None:
    cohort = ReturningCohort(DELAY_S)
    cohort.batch_finished(requests=2, last_request=0, now_s=5.0)
    assert cohort.awaiting(last_request=0, now_s=5.0 + DELAY_S - 0.001)
    assert not cohort.awaiting(last_request=0, now_s=5.0 + DELAY_S)


def test_a_batch_of_one_request_awaits_nobody() -> None:
    cohort = ReturningCohort(DELAY_S)
    cohort.batch_finished(requests=1, last_request=0, now_s=5.0)
    assert not cohort.awaiting(last_request=0, now_s=5.0)
    assert not cohort.back(last_request=1)


def test_a_batch_that_starts_ends_the_wait_for_the_cohort() -> None:
    cohort = ReturningCohort(DELAY_S)
    cohort.batch_finished(requests=2, last_request=0, now_s=5.0)
    cohort.batch_started()
    assert not cohort.awaiting(last_request=0, now_s=5.0)


# -- when a batch starts ----------------------------------------------------------------------------


def test_a_request_that_finds_the_batcher_idle_starts_at_once(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop)
    batches.submit(1)
    assert (len(batches.clock.soon), batches.clock.armed) == (1, [])
    batches.clock.run_soon()
    assert batches.started == [[1]]
    assert (batches.dispatcher.batches_started, batches.dispatcher.batches_started_at_once) == (1, 1)


def test_requests_of_the_same_turn_merge_into_the_idle_batch(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop)
    batches.submit(1)
    batches.submit(2, 3)
    batches.clock.run_soon()
    assert batches.started == [[1, 2, 3]]


def test_the_dispatcher_is_woken_once_however_many_due_requests_arrive_before_it_runs(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop, max_batch_size=1, max_concurrent_batches=3)
    for value in (1, 2, 3):
        batches.submit(value)
    assert len(batches.clock.soon) == 1
    batches.clock.run_soon()
    assert batches.started == [[1], [2], [3]]


def test_requests_behind_a_running_batch_share_one_timer_for_the_oldest_ones_delay(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop, max_concurrent_batches=2)
    batches.submit(1)
    batches.clock.run_soon()
    batches.clock.advance_to(0.25)
    batches.submit(2)
    batches.clock.advance_to(0.5)
    batches.submit(3)
    assert (batches.clock.soon, batches.clock.armed) == ([], [0.25 + DELAY_S])
    batches.clock.advance_to(0.25 + DELAY_S - 0.001)
    assert batches.started == [[1]]
    batches.clock.advance_to(0.25 + DELAY_S)
    assert batches.started == [[1], [2, 3]]
    assert batches.clock.armed == []


def test_a_batch_that_fills_starts_without_waiting_for_its_delay(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop, max_batch_size=2, max_concurrent_batches=2)
    batches.submit(1)
    batches.clock.run_soon()
    batches.submit(2)
    batches.submit(3)
    batches.clock.run_soon()
    assert batches.started == [[1], [2, 3]]


def test_no_batch_starts_while_max_concurrent_batches_run(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop, max_batch_size=2)
    batches.submit(1)
    batches.clock.run_soon()
    batches.submit(2, 3)
    assert (batches.clock.soon, batches.clock.armed) == ([], [])
    batches.finish()
    assert batches.started == [[1], [2, 3]]


def test_with_batching_disabled_each_request_starts_alone_without_a_timer(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop, max_concurrent_batches=3, enabled=False)
    for value in (1, 2, 3):
        batches.submit(value)
    batches.clock.run_soon()
    assert (batches.started, batches.clock.armed) == ([[1], [2], [3]], [])


def test_after_a_merged_batch_a_lone_request_waits_for_its_partners(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop)
    batches.run_merged_batch(1, 2)
    batches.clock.advance_to(0.1)
    batches.submit(3)
    assert (batches.clock.soon, batches.started) == ([], [[1, 2]])
    batches.clock.advance_to(0.2)
    batches.submit(4)  # the cohort is back: no more waiting
    batches.clock.run_soon()
    assert batches.started == [[1, 2], [3, 4]]
    assert batches.dispatcher.batches_started_at_once == 1


def test_partners_that_do_not_come_back_hold_a_request_for_at_most_its_delay(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop)
    batches.run_merged_batch(1, 2)
    batches.clock.advance_to(0.1)
    batches.submit(3)
    batches.clock.advance_to(0.1 + DELAY_S - 0.001)
    assert batches.started == [[1, 2]]
    batches.clock.advance_to(0.1 + DELAY_S)
    assert batches.started == [[1, 2], [3]]


def test_a_request_arriving_once_the_cohort_wait_is_over_starts_at_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop)
    batches.run_merged_batch(1, 2)
    batches.clock.advance_to(DELAY_S)
    batches.submit(3)
    batches.clock.run_soon()
    assert batches.started == [[1, 2], [3]]
    assert batches.dispatcher.batches_started_at_once == 2


def test_a_batch_that_waited_its_delay_during_a_merged_call_then_waits_for_that_calls_clients(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop)
    batches.submit(1)
    batches.submit(2)
    batches.clock.run_soon()
    batches.submit(3)  # queued at 0, behind the merged batch
    batches.clock.advance_to(3.0)  # its delay passed while the slot was taken
    batches.finish()
    assert (batches.started, batches.clock.armed) == ([[1, 2]], [3.0 + DELAY_S])
    batches.submit(4)
    assert batches.started == [[1, 2]]
    batches.submit(5)  # both clients back
    batches.clock.run_soon()
    assert batches.started == [[1, 2], [3, 4, 5]]


def test_the_wait_for_a_cohort_ends_the_delay_after_its_batch_finished(
    loop: asyncio.AbstractEventLoop,
) -> None:
    batches = Batches(loop)
    batches.submit(1)
    batches.submit(2)
    batches.clock.run_soon()
    batches.submit(3)
    batches.clock.advance_to(3.0)
    batches.finish()
    batches.clock.advance_to(3.0 + DELAY_S - 0.001)
    assert batches.started == [[1, 2]]
    batches.clock.advance_to(3.0 + DELAY_S)
    assert batches.started == [[1, 2], [3]]


def test_once_draining_a_waiting_batch_starts_without_its_delay(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop, max_concurrent_batches=2)
    batches.submit(1)
    batches.clock.run_soon()
    batches.submit(2)
    batches.dispatcher.drain()
    batches.dispatcher.start_due_batches()
    assert batches.started == [[1], [2]]


def test_a_cancelled_timer_never_starts_a_batch(loop: asyncio.AbstractEventLoop) -> None:
    batches = Batches(loop, max_concurrent_batches=2)
    batches.submit(1)
    batches.clock.run_soon()
    batches.submit(2)
    batches.dispatcher.cancel_timer()
    batches.clock.advance_to(10 * DELAY_S)
    assert batches.started == [[1]]
