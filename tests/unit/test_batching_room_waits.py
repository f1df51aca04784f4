"""Requests that wait for room in a full queue (``enqueue_or_wait``) instead of being refused.

A batcher whose queue holds 4 rows, with a backend held on a gate: the first request runs (its
rows have left the queue), the next fills the queue, and what comes after finds no room. Nothing
is timed but the bound on a wait, which is the event a test waits for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping

import numpy as np
import pytest

from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.core.batching.queue import Share
from udfserve.services.model_server.errors import QueueFull

SAFETY_TIMEOUT_S = 8.0
WAIT_S = 30.0
"""A bound on waiting that no test reaches (the safety timeout comes first)."""
BIG = Share(flow="app-big")
SMALL = Share(flow="app-small")


class GatedDoubler:
    """Doubles ``x``; every call waits for ``release`` (set it once, all calls go)."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.started.set()
        self.release.wait(timeout=SAFETY_TIMEOUT_S)
        self.batches.append(inputs["x"].tolist())
        return {"y": inputs["x"] * 2}

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, SAFETY_TIMEOUT_S)


class WaitRecorder:
    def __init__(self) -> None:
        self.room_waits: list[float] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        pass

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        pass

    def on_room_wait(self, model: str, seconds: float) -> None:
        self.room_waits.append(seconds)


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=True)


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), timeout=SAFETY_TIMEOUT_S)

    asyncio.run(bounded())


async def full_batcher(
    backend: GatedDoubler, executor: concurrent.futures.Executor, **kwargs: object
) -> tuple[DynamicBatcher, list[asyncio.Future[dict[str, np.ndarray]]]]:
    """A started batcher of a 4-row queue: one request running on the gate, one filling the queue."""
    batcher = DynamicBatcher(
        "m",
        backend,
        max_batch_size=4,
        max_queue_rows=4,
        config=BatchingConfig(max_queue_delay_s=0.001),
        executor=executor,
        **kwargs,  # type: ignore[arg-type]
    )
    batcher.start()
    running = batcher.enqueue(rows(1, 1, 1, 1), BIG)
    await backend.wait_started()
    queued = batcher.enqueue(rows(2, 2, 2, 2), BIG)
    assert batcher.queued_rows == 4
    return batcher, [running, queued]


def test_a_request_past_its_share_waits_and_is_queued_once_rows_leave(
    executor: concurrent.futures.Executor,
) -> None:
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        answer, hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        assert hold is not None and not hold.done() and batcher.queued_rows == 4
        backend.release.set()
        await hold  # the running batch finished, the queued one started: room for this one
        assert (await answer)["y"].tolist() == [6, 6, 6, 6]
        await asyncio.gather(*earlier)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]]


def test_without_a_wait_a_request_past_its_share_is_refused_at_once(
    executor: concurrent.futures.Executor,
) -> None:
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        with pytest.raises(QueueFull, match=r"queue full: 4 rows queued, this request has 4"):
            batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, 0.0)
        backend.release.set()
        await asyncio.gather(*earlier)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_request_that_waits_past_its_bound_is_refused_saying_how_long_it_waited(
    executor: concurrent.futures.Executor,
) -> None:
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        answer, hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, 0.05)
        assert hold is not None
        with pytest.raises(QueueFull, match=r"queue full: 4 rows queued.*it waited 0\.05 s for room"):
            await answer
        assert hold.done()
        backend.release.set()
        await asyncio.gather(*earlier)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert [3.0] not in [batch[:1] for batch in backend.batches]


def test_a_new_request_of_an_application_with_requests_waiting_waits_behind_them(
    executor: concurrent.futures.Executor,
) -> None:
    """One row would fit beside the three queued, but the four-row request came first."""
    backend = GatedDoubler()

    async def body() -> None:
        batcher = DynamicBatcher(
            "m",
            backend,
            max_batch_size=4,
            max_queue_rows=4,
            config=BatchingConfig(max_queue_delay_s=0.001),
            executor=executor,
        )
        batcher.start()
        running = batcher.enqueue(rows(1, 1, 1, 1), BIG)
        await backend.wait_started()
        queued = batcher.enqueue(rows(2, 2, 2), BIG)
        first, first_hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        second, second_hold = batcher.enqueue_or_wait(rows(4), BIG, WAIT_S)
        assert first_hold is not None and second_hold is not None
        assert not second_hold.done() and batcher.queued_rows == 3
        backend.release.set()
        await asyncio.gather(running, queued, first, second)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches[2:] == [[3, 3, 3, 3], [4]]


def test_another_application_is_queued_at_once_while_one_waits(executor: concurrent.futures.Executor) -> None:
    """Fair shares hold: the busy application's wait does not hold back the small one."""
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        busy, busy_hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        small, small_hold = batcher.enqueue_or_wait(rows(5, 5), SMALL, WAIT_S)
        assert busy_hold is not None and not busy_hold.done()
        assert small_hold is None and batcher.queued_rows == 6
        backend.release.set()
        await asyncio.gather(*earlier, busy, small)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_waiting_request_whose_caller_left_is_never_run(executor: concurrent.futures.Executor) -> None:
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        answer, hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        assert hold is not None
        answer.cancel()
        await hold
        backend.release.set()
        await asyncio.gather(*earlier)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert backend.batches == [[1, 1, 1, 1], [2, 2, 2, 2]]


def test_stopping_the_batcher_refuses_every_waiting_request_for_a_resend(
    executor: concurrent.futures.Executor,
) -> None:
    backend = GatedDoubler()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor)
        answer, hold = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        stopping = asyncio.create_task(batcher.stop(grace_period_s=SAFETY_TIMEOUT_S))
        with pytest.raises(QueueFull, match=r"model 'm' stopped before it had room for this request"):
            await answer
        assert hold is not None and hold.done()
        backend.release.set()
        await asyncio.gather(*earlier)
        await stopping

    run(body)
    assert backend.batches == [[1, 1, 1, 1], [2, 2, 2, 2]]


def test_each_wait_for_room_is_reported_to_the_observer(executor: concurrent.futures.Executor) -> None:
    backend = GatedDoubler()
    observer = WaitRecorder()

    async def body() -> None:
        batcher, earlier = await full_batcher(backend, executor, observer=observer)
        answer, _ = batcher.enqueue_or_wait(rows(3, 3, 3, 3), BIG, WAIT_S)
        backend.release.set()
        await asyncio.gather(*earlier, answer)
        await batcher.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert len(observer.room_waits) == 1 and observer.room_waits[0] > 0
