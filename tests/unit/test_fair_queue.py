"""A model's queue shared by Spark applications: weighted fair queueing in rows, bounded shares.

The queue alone, with no batcher around it: every test puts chunks of known sizes, then asks for
the batches the queue would start, in order. Batches of ``LIMIT`` rows hold one 100-row chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from udfserve.services.model_server.core.batching.queue import (
    HARD_LIMIT_FACTOR,
    OVERFLOW_FLOW,
    Chunk,
    RequestQueue,
    Share,
)
from udfserve.services.model_server.core.job_context import JobContext
from udfserve.services.model_server.core.shares import ApplicationShares
from udfserve.services.model_server.errors import QueueFull

LIMIT = 100
BIG = Share(flow="app-big")
SMALL = Share(flow="app-small")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def new_queue(max_rows: int = 10_000, max_flows: int = 64) -> RequestQueue:
    return RequestQueue("m", max_rows, on_cancelled=lambda: None, max_flows=max_flows)


def put(queue: RequestQueue, loop: asyncio.AbstractEventLoop, share: Share, rows: int = LIMIT) -> list[Chunk]:
    queue.admit(rows, share)
    inputs = {"x": np.zeros((rows, 4), np.float32)}
    return queue.put(inputs, rows, LIMIT, loop, now_s=0.0, at_once=False, share=share)


def next_batches(queue: RequestQueue, count: int, limit: int = LIMIT) -> list[list[str]]:
    """The flows of the chunks of the next ``count`` batches, started in order."""
    started = []
    for _ in range(count):
        batch, _ = queue.candidates(limit, merge=True)
        if not batch:
            break
        queue.take(batch)
        started.append([chunk.flow for chunk in batch])
    return started


def test_one_application_alone_is_served_first_in_first_out(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue()
    chunks = [put(queue, loop, BIG)[0] for _ in range(5)]

    order = []
    for _ in chunks:
        batch, _ = queue.candidates(LIMIT, merge=True)
        queue.take(batch)
        order += batch

    assert order == chunks


def test_an_application_that_starts_waiting_is_served_within_one_batch_of_a_busy_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue()
    for _ in range(16):
        put(queue, loop, BIG)
    next_batches(queue, 3)

    put(queue, loop, SMALL)

    assert ["app-small"] in next_batches(queue, 2)


def test_two_busy_applications_of_equal_weight_get_rows_in_turn(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue()
    for _ in range(16):
        put(queue, loop, BIG)
    for _ in range(4):
        put(queue, loop, SMALL)

    first_eight = [flows[0] for flows in next_batches(queue, 8)]

    assert first_eight.count("app-small") == 4


def test_weights_share_the_rows_in_their_ratio(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue()
    heavy, light = Share(flow="heavy", weight=3.0), Share(flow="light", weight=1.0)
    for _ in range(12):
        put(queue, loop, heavy)
        put(queue, loop, light)

    first_eight = [flows[0] for flows in next_batches(queue, 8)]

    assert (first_eight.count("heavy"), first_eight.count("light")) == (6, 2)


def test_shares_count_rows_not_requests(loop: asyncio.AbstractEventLoop) -> None:
    """An application sending requests of 25 rows gets four of them per 100-row request of the other."""
    queue = new_queue()
    for _ in range(4):
        put(queue, loop, BIG, rows=100)
    for _ in range(16):
        put(queue, loop, SMALL, rows=25)

    rows = {"app-big": 0, "app-small": 0}
    for _ in range(8):
        batch, _ = queue.candidates(25, merge=False)
        queue.take(batch)
        rows[batch[0].flow] += batch[0].rows

    assert abs(rows["app-big"] - rows["app-small"]) <= 100


def test_a_batch_merges_the_requests_of_several_applications_in_fair_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue()
    for _ in range(4):
        put(queue, loop, BIG, rows=50)
    put(queue, loop, SMALL, rows=50)

    [flows] = next_batches(queue, 1, limit=150)

    assert flows == ["app-big", "app-small", "app-big"]


def test_an_application_past_its_share_is_refused_while_another_is_admitted(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue(max_rows=1_000)
    for _ in range(10):
        put(queue, loop, BIG)  # alone, it may take max_rows
    put(queue, loop, SMALL)

    with pytest.raises(
        QueueFull,
        match=r"queue full for application 'app-big': it holds 1000 rows .* share is 1000 of the 2000 rows",
    ):
        put(queue, loop, BIG)
    put(queue, loop, SMALL)  # still admitted

    assert queue.flows["app-small"].rows == 2 * LIMIT


def test_two_applications_of_equal_weight_each_keep_as_many_rows_waiting_as_alone(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue(max_rows=1_000)
    for _ in range(10):
        put(queue, loop, BIG)
        put(queue, loop, SMALL)

    assert (queue.flows["app-big"].rows, queue.flows["app-small"].rows) == (1_000, 1_000)
    with pytest.raises(QueueFull, match=r"application 'app-small'"):
        put(queue, loop, SMALL)


def test_a_third_waiting_application_shrinks_each_share_to_a_third_of_the_whole_queue(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue(max_rows=1_000)
    for _ in range(6):
        put(queue, loop, BIG)
    put(queue, loop, SMALL)
    put(queue, loop, Share(flow="app-third"))

    with pytest.raises(
        QueueFull, match=r"it holds 600 rows .* share is 666 of the 2000 rows .* 3 applications"
    ):
        put(queue, loop, BIG)  # 700 rows: past a third of 2000


def test_a_heavier_application_keeps_a_larger_share_of_the_queue(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue(max_rows=1_000)
    heavy, light = Share(flow="app-heavy", weight=3.0), Share(flow="app-light", weight=1.0)
    put(queue, loop, heavy)
    for _ in range(5):
        put(queue, loop, light)  # 500 rows: a quarter of 2000

    with pytest.raises(QueueFull, match=r"application 'app-light': it holds 500 rows .* share is 500"):
        put(queue, loop, light)
    for _ in range(9):
        put(queue, loop, heavy)  # 1000 rows: max_rows, under three quarters of 2000
    assert queue.flows["app-heavy"].rows == 1_000


def test_the_whole_queue_holds_at_most_twice_its_bound_however_many_applications_come(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = new_queue(max_rows=1_000)
    admitted = 0
    with pytest.raises(QueueFull, match=r"the limit is 2000 rows over all applications"):
        for index in range(100):
            put(queue, loop, Share(flow=f"app-{index}"))
            admitted += LIMIT

    assert admitted == HARD_LIMIT_FACTOR * 1_000


def test_applications_beyond_the_bound_share_one_flow(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue(max_flows=3)
    for index in range(6):
        put(queue, loop, Share(flow=f"app-{index}"))

    assert set(queue.flows) == {"app-0", "app-1", "app-2", OVERFLOW_FLOW}
    assert queue.flows[OVERFLOW_FLOW].rows == 3 * LIMIT


def test_a_cancelled_chunk_leaves_its_application_s_flow(loop: asyncio.AbstractEventLoop) -> None:
    queue = new_queue()
    [chunk] = put(queue, loop, SMALL)
    chunk.future.cancel()
    loop.run_until_complete(asyncio.sleep(0))  # the done callback runs on the loop

    assert "app-small" not in queue.flows and queue.rows == 0


def shares(scheduling: str = "fair") -> ApplicationShares:
    return ApplicationShares(scheduling, {"interactive": 8, "default": 2, "batch": 1}, "default")


def test_an_application_is_scheduled_with_its_class_s_weight() -> None:
    share = shares().share_of(JobContext(app_id="app-1", priority_class="interactive"))
    assert (share.flow, share.weight) == ("app-1", 8.0)


def test_a_class_the_server_does_not_list_gets_the_default_class() -> None:
    share = shares().share_of(JobContext(app_id="app-1", priority_class="platinum"))
    assert share.weight == 2.0


def test_requests_naming_no_application_form_one_more_application_of_the_default_class() -> None:
    share = shares().share_of(JobContext())
    assert (share.flow, share.weight) == ("", 2.0)


def test_fifo_scheduling_puts_every_application_in_one_flow() -> None:
    share = shares("fifo").share_of(JobContext(app_id="app-1", priority_class="interactive"))
    assert (share.flow, share.weight) == ("", 1.0)


def test_fifo_scheduling_still_observes_each_application_s_queue_wait_without_a_weight() -> None:
    heard: list[tuple[str, str, int | None, float]] = []
    fifo = ApplicationShares(
        "fifo",
        {"interactive": 8, "default": 2},
        "default",
        observe_wait=lambda job, scheduled_as, weight, s: heard.append((job.app_id, scheduled_as, weight, s)),
    )
    share = fifo.share_of(JobContext(app_id="app-1", priority_class="interactive"))
    assert share.on_start is not None
    share.on_start(0.25)

    assert (share.flow, heard) == ("", [("app-1", "interactive", None, 0.25)])
