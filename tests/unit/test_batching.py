"""The dynamic batcher: merging, splitting, back-pressure, failure isolation and shutdown.

Timing is never asserted: "a batch fills up" uses an exact batch size with the longest delay a
config allows, longer than the time any test may take (the test would time out otherwise); "the
delay fires" uses a batch that cannot fill. Batches are held in flight with a
``threading.Event`` gate instead of sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import pytest

from udfserve.runtime.errors import BackendFault, InvalidInput
from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.errors import ModelUnavailable, QueueFull

T = TypeVar("T")
LONG_DELAY_S = 10.0  # the most BatchingConfig accepts
SAFETY_TIMEOUT_S = 8.0  # below LONG_DELAY_S: waiting for the delay instead of a full batch fails
COHORT_DELAY_S = 2.0  # a delay a test waits out: longer than any stall of a loaded machine, below the timeout


def run(test: Callable[[], Awaitable[T]]) -> T:
    """Run one async test body; the timeout only turns a hang into a clear failure."""

    async def bounded() -> T:
        return await asyncio.wait_for(test(), timeout=SAFETY_TIMEOUT_S)

    return asyncio.run(bounded())


async def let_queued_tasks_run() -> None:
    """Yield once: tasks created before this call run up to their first real wait (FIFO)."""
    await asyncio.sleep(0)


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


class Doubler:
    """A backend that doubles ``x`` and records the batches it saw."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self._lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.batches.append(inputs["x"].tolist())
        return {"y": inputs["x"] * 2}

    @property
    def batch_sizes(self) -> list[int]:
        return [len(batch) for batch in self.batches]


class Gated(Doubler):
    """A doubler whose calls wait for ``release``; ``started`` is set when a call begins."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.started.set()
        self.release.wait(timeout=SAFETY_TIMEOUT_S)
        return super().__call__(inputs)

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, SAFETY_TIMEOUT_S)


HOLD = 7.0


class HeldOn(Doubler):
    """A doubler whose calls holding ``value`` wait for ``release``; other calls run at once."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["x"] == self.value).any():
            self.held.set()
            self.release.wait(timeout=SAFETY_TIMEOUT_S)
        return super().__call__(inputs)

    async def wait_held(self) -> None:
        assert await asyncio.to_thread(self.held.wait, SAFETY_TIMEOUT_S)


class Recorder:
    def __init__(self) -> None:
        self.waits: list[tuple[str, float]] = []
        self.batches: list[tuple[str, int, int, float]] = []
        self.succeeded: list[bool] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        self.waits.append((model, seconds))

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.batches.append((model, rows, requests, seconds))
        self.succeeded.append(succeeded)


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=True)


def batcher(
    predict: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    executor: concurrent.futures.Executor,
    *,
    max_batch_size: int = 4,
    delay_s: float = LONG_DELAY_S,
    enabled: bool = True,
    **kwargs: Any,
) -> DynamicBatcher:
    config = BatchingConfig(enabled=enabled, max_queue_delay_s=delay_s)
    started = DynamicBatcher(
        "m", predict, max_batch_size=max_batch_size, config=config, executor=executor, **kwargs
    )
    started.start()
    return started


def y(result: dict[str, np.ndarray]) -> list[float]:
    return result["y"].tolist()


# -- merging -------------------------------------------------------------------------------------


def test_a_full_batch_runs_without_waiting_for_the_delay(executor: concurrent.futures.Executor) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=4)
        first, second = await asyncio.gather(b.submit(rows(1, 2)), b.submit(rows(3, 4)))
        assert (y(first), y(second)) == ([2, 4], [6, 8])
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3, 4]]


def test_the_delay_fires_for_a_batch_that_cannot_fill(executor: concurrent.futures.Executor) -> None:
    """While a batch runs, a request waits for partners; with a second slot free it starts once
    it has waited the delay, the first batch still running."""
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=0.01, max_concurrent_batches=2)
        held = asyncio.create_task(b.submit(rows(HOLD)))
        await backend.wait_held()
        waiting = asyncio.create_task(b.submit(rows(1, 2, 3)))
        await let_queued_tasks_run()
        assert (b.batches_started, b.queued_rows) == (1, 3)
        assert y(await waiting) == [2, 4, 6]
        assert not held.done()
        backend.release.set()
        assert y(await held) == [2 * HOLD]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3], [HOLD]]


def test_merged_requests_get_their_own_rows_back_in_order(executor: concurrent.futures.Executor) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=6)
        results = await asyncio.gather(b.submit(rows(1)), b.submit(rows(2, 3)), b.submit(rows(4, 5, 6)))
        assert [y(r) for r in results] == [[2], [4, 6], [8, 10, 12]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3, 4, 5, 6]]


def test_a_request_that_does_not_fit_goes_to_the_next_batch_whole(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=4, delay_s=0.01)
        results = await asyncio.gather(b.submit(rows(1, 2, 3)), b.submit(rows(4, 5)))
        assert [y(r) for r in results] == [[2, 4, 6], [8, 10]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3], [4, 5]]


def test_an_oversized_request_is_split_into_chunks_answered_in_order(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=4, delay_s=0.0)
        result = await b.submit(rows(*range(10)))
        assert y(result) == [2.0 * v for v in range(10)]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batch_sizes == [4, 4, 2]


def test_requests_with_different_per_row_shapes_are_not_merged(executor: concurrent.futures.Executor) -> None:
    backend_shapes: list[tuple[int, ...]] = []

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        backend_shapes.append(inputs["x"].shape)
        return {"y": inputs["x"] * 2}

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=4, delay_s=0.01)
        narrow, wide = await asyncio.gather(
            b.submit({"x": np.ones((1, 2), np.float32)}), b.submit({"x": np.ones((1, 3), np.float32)})
        )
        assert (narrow["y"].shape, wide["y"].shape) == ((1, 2), (1, 3))
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert sorted(backend_shapes) == [(1, 2), (1, 3)]


def test_disabled_batching_runs_each_request_alone(executor: concurrent.futures.Executor) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=10, enabled=False)
        results = await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)), b.submit(rows(3)))
        assert [y(r) for r in results] == [[2], [4], [6]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1], [2], [3]]


def test_up_to_max_concurrent_batches_run_at_once(executor: concurrent.futures.Executor) -> None:
    both_running = threading.Barrier(2, timeout=SAFETY_TIMEOUT_S)

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        both_running.wait()  # raises BrokenBarrierError unless two calls overlap
        return {"y": inputs["x"] * 2}

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=1, max_concurrent_batches=2)
        results = await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)))
        assert [y(r) for r in results] == [[2], [4]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_an_empty_request_is_a_caller_error(executor: concurrent.futures.Executor) -> None:
    async def body() -> None:
        b = batcher(Doubler(), executor)
        with pytest.raises(ValueError, match="empty request"):
            await b.submit(rows())
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


# -- when a batch starts ---------------------------------------------------------------------------


def test_a_lone_request_starts_at_once_without_waiting_for_the_delay(
    executor: concurrent.futures.Executor,
) -> None:
    """With the longest delay a config allows, waiting for it would exceed the test's timeout."""
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=LONG_DELAY_S)
        assert y(await b.submit(rows(1))) == [2]
        assert y(await b.submit(rows(2, 3))) == [4, 6]
        assert (b.batches_started, b.batches_started_at_once) == (2, 2)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1], [2, 3]]


def test_requests_queued_in_the_same_turn_of_the_loop_merge_when_idle(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=LONG_DELAY_S)
        results = await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)), b.submit(rows(3, 4)))
        assert [y(r) for r in results] == [[2], [4], [6, 8]]
        assert b.batches_started == 1
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3, 4]]


def test_requests_arriving_while_a_batch_runs_merge_into_the_next_one(
    executor: concurrent.futures.Executor,
) -> None:
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=0.01)
        running = asyncio.create_task(b.submit(rows(HOLD)))
        await backend.wait_held()
        later = [asyncio.create_task(b.submit(rows(value))) for value in (1, 2, 3)]
        await let_queued_tasks_run()
        assert (b.batches_started, b.queued_rows) == (1, 3)
        backend.release.set()
        assert y(await running) == [2 * HOLD]
        assert [y(await task) for task in later] == [[2], [4], [6]]
        assert (b.batches_started, b.batches_started_at_once) == (2, 1)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[HOLD], [1, 2, 3]]


def test_a_batch_that_fills_while_another_runs_starts_when_the_slot_frees(
    executor: concurrent.futures.Executor,
) -> None:
    """With the longest delay a config allows, waiting for it would exceed the test's timeout."""
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=3, delay_s=LONG_DELAY_S)
        running = asyncio.create_task(b.submit(rows(HOLD)))
        await backend.wait_held()
        later = [asyncio.create_task(b.submit(rows(value))) for value in (1, 2, 3)]
        await let_queued_tasks_run()
        backend.release.set()
        assert y(await running) == [2 * HOLD]
        assert [y(await task) for task in later] == [[2], [4], [6]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[HOLD], [1, 2, 3]]


def test_after_a_merged_batch_an_idle_batcher_waits_for_the_partners_coming_back(
    executor: concurrent.futures.Executor,
) -> None:
    """Two clients in a closed loop: the first to send again does not start a batch alone."""
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=2, delay_s=LONG_DELAY_S)
        await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)))
        first_back = asyncio.create_task(b.submit(rows(3)))
        await let_queued_tasks_run()
        assert (b.batches_started, b.queued_rows) == (1, 1)
        assert y(await b.submit(rows(4))) == [8]
        assert y(await first_back) == [6]
        assert (b.batches_started, b.batches_started_at_once) == (2, 1)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2], [3, 4]]


def test_a_merged_batchs_clients_all_back_start_the_next_batch_without_the_delay(
    executor: concurrent.futures.Executor,
) -> None:
    """Three clients in a closed loop, a batch far from full: with the longest delay a config
    allows, waiting for it would exceed the test's timeout."""
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=LONG_DELAY_S)
        await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)), b.submit(rows(3)))
        back = [asyncio.create_task(b.submit(rows(value))) for value in (4, 5)]
        await let_queued_tasks_run()
        assert (b.batches_started, b.queued_rows) == (1, 2)
        assert y(await b.submit(rows(6))) == [12]
        assert [y(await task) for task in back] == [[8], [10]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3], [4, 5, 6]]


def test_a_batch_queued_during_a_merged_call_waits_for_that_calls_clients_and_merges_with_them(
    executor: concurrent.futures.Executor,
) -> None:
    """Without the wait, closed-loop clients alternate two half batches forever."""
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=LONG_DELAY_S)
        running = asyncio.gather(b.submit(rows(HOLD)), b.submit(rows(1)))
        await backend.wait_held()
        queued = asyncio.create_task(b.submit(rows(2)))
        await let_queued_tasks_run()
        backend.release.set()
        await running
        await let_queued_tasks_run()
        assert (b.batches_started, b.queued_rows) == (1, 1)
        back = [asyncio.create_task(b.submit(rows(value))) for value in (3, 4)]
        assert [y(await task) for task in back] == [[6], [8]]
        assert y(await queued) == [4]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[HOLD, 1], [2, 3, 4]]


def test_clients_that_do_not_come_back_delay_the_next_batch_by_at_most_the_delay(
    executor: concurrent.futures.Executor,
) -> None:
    """The delay runs from the end of the merged batch: it must outlast the moments between that
    end and the next request, which a loaded machine can stretch to tenths of a second."""
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=COHORT_DELAY_S)
        await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)), b.submit(rows(3)))
        assert y(await b.submit(rows(4))) == [8]
        assert (b.batches_started, b.batches_started_at_once) == (2, 1)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2, 3], [4]]


def test_a_lone_client_after_a_merged_batch_starts_at_once_once_the_delay_passed(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=0.05)
        await asyncio.gather(b.submit(rows(1)), b.submit(rows(2)))
        await asyncio.sleep(0.1)
        assert y(await b.submit(rows(3))) == [6]
        assert (b.batches_started, b.batches_started_at_once) == (2, 2)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_full_batch_does_not_wait_for_the_running_one_when_a_slot_is_free(
    executor: concurrent.futures.Executor,
) -> None:
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=2, delay_s=LONG_DELAY_S, max_concurrent_batches=2)
        running = asyncio.create_task(b.submit(rows(HOLD)))
        await backend.wait_held()
        assert y(await b.submit(rows(1, 2))) == [2, 4]
        assert not running.done()
        assert (b.batches_started, b.batches_started_at_once) == (2, 1)
        backend.release.set()
        assert y(await running) == [2 * HOLD]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_cancelled_request_does_not_hold_back_the_batch_behind_it(
    executor: concurrent.futures.Executor,
) -> None:
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=100, delay_s=0.01)
        running = asyncio.create_task(b.submit(rows(HOLD)))
        await backend.wait_held()
        abandoned = b.enqueue(rows(5, 6))
        kept = asyncio.create_task(b.submit(rows(1)))
        await let_queued_tasks_run()
        abandoned.cancel()
        backend.release.set()
        assert y(await running) == [2 * HOLD]
        assert y(await kept) == [2]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[HOLD], [1]]


def test_enqueue_answers_through_the_future_it_returns(executor: concurrent.futures.Executor) -> None:
    async def body() -> None:
        b = batcher(Doubler(), executor, max_batch_size=4, delay_s=0.0)
        whole = b.enqueue(rows(*range(10)))  # three chunks, one future
        single = b.enqueue(rows(3))
        assert y(await whole) == [2.0 * v for v in range(10)]
        assert y(await single) == [6]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_enqueue_refuses_a_full_queue_at_once(executor: concurrent.futures.Executor) -> None:
    backend = HeldOn(HOLD)

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=2, delay_s=0.0, max_queue_rows=2)
        running = b.enqueue(rows(HOLD))
        await backend.wait_held()
        queued = b.enqueue(rows(1, 2))
        with pytest.raises(QueueFull, match="2 rows queued, this request has 1, the limit is 2"):
            b.enqueue(rows(3))
        backend.release.set()
        assert (y(await running), y(await queued)) == ([2 * HOLD], [2, 4])
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


# -- back-pressure and cancellation --------------------------------------------------------------


def test_queue_full_refuses_the_whole_request_and_queues_nothing(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Gated()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=2, delay_s=0.0, max_queue_rows=4)
        in_flight = asyncio.create_task(b.submit(rows(1, 2)))
        await backend.wait_started()
        queued = asyncio.create_task(b.submit(rows(3, 4, 5)))
        await let_queued_tasks_run()
        assert b.queued_rows == 3
        with pytest.raises(
            QueueFull, match=r"model 'm': queue full: 3 rows queued, this request has 2, the limit is 4"
        ):
            await b.submit(rows(6, 7))
        assert b.queued_rows == 3
        backend.release.set()
        assert y(await in_flight) == [2, 4]
        assert y(await queued) == [6, 8, 10]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 2], [3, 4], [5]]


def test_a_request_larger_than_the_queue_is_admitted_when_the_queue_is_empty(
    executor: concurrent.futures.Executor,
) -> None:
    async def body() -> None:
        b = batcher(Doubler(), executor, max_batch_size=2, delay_s=0.0, max_queue_rows=2)
        assert y(await b.submit(rows(1, 2, 3, 4, 5))) == [2, 4, 6, 8, 10]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_cancelled_request_is_dropped_before_it_runs(executor: concurrent.futures.Executor) -> None:
    backend = Gated()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=2, delay_s=0.0)
        in_flight = asyncio.create_task(b.submit(rows(1)))
        await backend.wait_started()
        abandoned = asyncio.create_task(b.submit(rows(99, 98)))
        await let_queued_tasks_run()
        assert b.queued_rows == 2
        abandoned.cancel()
        with pytest.raises(asyncio.CancelledError):
            await abandoned
        assert b.queued_rows == 0
        backend.release.set()
        assert y(await in_flight) == [2]
        assert y(await b.submit(rows(3))) == [6]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1], [3]]


# -- failures ------------------------------------------------------------------------------------


def test_a_bad_request_merged_with_good_ones_fails_alone(executor: concurrent.futures.Executor) -> None:
    calls: list[list[float]] = []

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(inputs["x"].tolist())
        if (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return {"y": inputs["x"] * 2}

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=3)
        good, bad, other = await asyncio.gather(
            b.submit(rows(1)), b.submit(rows(-1)), b.submit(rows(2)), return_exceptions=True
        )
        assert isinstance(good, dict) and y(good) == [2]
        assert isinstance(other, dict) and y(other) == [4]
        assert isinstance(bad, BackendFault)
        assert str(bad) == "model 'm': backend failed: ValueError: negative input"
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert calls == [[1, -1, 2], [1], [-1], [2]]


def test_serving_errors_from_the_backend_reach_the_caller_unchanged(
    executor: concurrent.futures.Executor,
) -> None:
    refusal = InvalidInput("model 'm': column 'x': expected finite values, received NaN in row 0")

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise refusal

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=1)
        with pytest.raises(InvalidInput) as caught:
            await b.submit(rows(1))
        assert caught.value is refusal
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_an_output_with_the_wrong_row_count_is_a_backend_fault(executor: concurrent.futures.Executor) -> None:
    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"][1:]}

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=2)
        with pytest.raises(BackendFault, match="output 'y' has 1 rows; expected 2"):
            await b.submit(rows(1, 2))
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def padded_to_longest_row(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A tokenizer's shape: each row ``x`` ones, padded to the longest row of the call."""
    lengths = inputs["x"].astype(int)
    tokens = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
    for row, length in enumerate(lengths):
        tokens[row, :length] = 1
    return {"tokens": tokens}


def test_a_request_cut_into_calls_whose_outputs_differ_in_shape_gets_an_error_naming_them(
    executor: concurrent.futures.Executor,
) -> None:
    async def body() -> None:
        b = batcher(padded_to_longest_row, executor, max_batch_size=4)
        with pytest.raises(InvalidInput) as caught:
            await b.submit(rows(1, 2, 3, 5, 1, 2))  # calls of 4 rows (width 5) and 2 rows (width 2)
        assert str(caught.value) == (
            "model 'm': output 'tokens' came back with rows of shape (2,) and (5,) from the calls this "
            "request's 6 rows ran in (the model runs at most 4 rows at once, and a call that runs out of "
            "memory is split); an output whose shape depends on the rows it is computed with cannot be "
            "joined: send at most 4 rows per request, or give the output a fixed shape"
        )
        alone = await b.submit(rows(1, 2))  # the batcher goes on serving
        assert alone["tokens"].tolist() == [[1, 0], [1, 1]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_request_cut_into_calls_whose_outputs_agree_in_shape_is_answered_joined(
    executor: concurrent.futures.Executor,
) -> None:
    async def body() -> None:
        b = batcher(padded_to_longest_row, executor, max_batch_size=2)
        answer = await b.submit(rows(3, 1, 2, 3))  # both calls pad to 3
        assert answer["tokens"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


# -- shutdown ------------------------------------------------------------------------------------


def test_stop_refuses_new_requests_and_finishes_queued_and_running_ones(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Gated()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=1)
        in_flight = asyncio.create_task(b.submit(rows(1)))
        await backend.wait_started()
        queued = asyncio.create_task(b.submit(rows(2)))
        await let_queued_tasks_run()
        stopping = asyncio.create_task(b.stop(grace_period_s=SAFETY_TIMEOUT_S))
        await let_queued_tasks_run()
        with pytest.raises(ModelUnavailable, match="model 'm' is shutting down"):
            await b.submit(rows(3))
        backend.release.set()
        await stopping
        assert (y(await in_flight), y(await queued)) == ([2], [4])

    run(body)
    assert backend.batches == [[1], [2]]


def test_stop_returns_once_the_last_queued_request_is_cancelled(
    executor: concurrent.futures.Executor,
) -> None:
    """The grace period is far longer than the test may run: stop must notice the queue emptied by
    the cancellation, not wait the period out."""
    backend = Doubler()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=4)
        queued = b.enqueue(rows(2))
        queued.cancel()
        await b.stop(grace_period_s=3600.0)
        assert b.queued_rows == 0

    run(body)
    assert backend.batches == []


def test_work_left_after_the_grace_period_is_answered_unavailable(
    executor: concurrent.futures.Executor,
) -> None:
    backend = Gated()

    async def body() -> None:
        b = batcher(backend, executor, max_batch_size=1)
        in_flight = asyncio.create_task(b.submit(rows(1)))
        await backend.wait_started()
        queued = asyncio.create_task(b.submit(rows(2)))
        await let_queued_tasks_run()
        await b.stop(grace_period_s=0.0)
        for task in (in_flight, queued):
            with pytest.raises(ModelUnavailable, match="shut down before answering"):
                await task
        backend.release.set()

    run(body)


# -- observer ------------------------------------------------------------------------------------


def test_observer_sees_each_queue_wait_and_each_backend_call(executor: concurrent.futures.Executor) -> None:
    observer = Recorder()

    async def body() -> None:
        b = batcher(Doubler(), executor, max_batch_size=3, observer=observer)
        await asyncio.gather(b.submit(rows(1)), b.submit(rows(2, 3)))
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert [model for model, _ in observer.waits] == ["m", "m"]
    assert all(seconds >= 0 for _, seconds in observer.waits)
    assert [(model, batch_rows, requests) for model, batch_rows, requests, _ in observer.batches] == [
        ("m", 3, 2)
    ]
    assert observer.succeeded == [True]
