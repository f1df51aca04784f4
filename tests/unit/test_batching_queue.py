"""The queue of one model: admission bounded in rows, requests cut into chunks of the batch limit,
which chunks a batch takes, and chunks whose caller went away."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from udfserve.services.model_server.core.batching.queue import Chunk, RequestQueue, rows_of
from udfserve.services.model_server.errors import QueueFull


def rows(*values: float, width: int | None = None) -> dict[str, np.ndarray]:
    x = np.array(values, dtype=np.float32)
    return {"x": x if width is None else np.repeat(x[:, None], width, axis=1)}


def put(
    queue: RequestQueue, loop: asyncio.AbstractEventLoop, inputs: dict[str, np.ndarray], limit: int = 4
) -> list[Chunk]:
    count = rows_of(inputs)
    queue.admit(count)
    return queue.put(inputs, count, limit, loop, now_s=0.0, at_once=False)


def values(chunks: list[Chunk]) -> list[list[float]]:
    return [chunk.inputs["x"].tolist() for chunk in chunks]


# -- admission -----------------------------------------------------------------------------------


def test_a_request_that_would_overflow_the_queue_is_refused_naming_the_rows(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = RequestQueue("m", max_rows=4, on_cancelled=lambda: None)
    put(queue, loop, rows(1, 2, 3))
    with pytest.raises(
        QueueFull, match=r"model 'm': queue full: 3 rows queued, this request has 2, the limit is 4"
    ):
        queue.admit(2)
    assert (queue.rows, queue.requests) == (3, 1)


def test_an_empty_queue_admits_a_request_larger_than_the_whole_queue(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=2, on_cancelled=lambda: None)
    put(queue, loop, rows(1, 2, 3, 4, 5))
    assert queue.rows == 5


def test_a_request_of_no_rows_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="empty request"):
        rows_of(rows())


def test_a_request_whose_arrays_differ_in_rows_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match=r"input arrays differ in row count: \{'a': 2, 'b': 3\}"):
        rows_of({"a": np.zeros(2), "b": np.zeros(3)})


# -- chunks --------------------------------------------------------------------------------------


def test_a_request_larger_than_the_limit_is_cut_into_chunks_that_know_their_rows(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    chunks = put(queue, loop, rows(*range(10)), limit=4)
    assert values(chunks) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [(chunk.first_row, chunk.rows, chunk.request_rows) for chunk in chunks] == [
        (0, 4, 10),
        (4, 4, 10),
        (8, 2, 10),
    ]
    assert {chunk.request for chunk in chunks} == {1}


def test_each_request_gets_the_next_number(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    numbers = [put(queue, loop, rows(value))[0].request for value in (1, 2, 3)]
    assert numbers == [1, 2, 3]


# -- the batch the oldest request would run in -----------------------------------------------------


def test_a_batch_takes_the_requests_behind_the_oldest_until_the_next_would_not_fit(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    for request in (rows(1), rows(2, 3), rows(4, 5), rows(6)):
        put(queue, loop, request)
    batch, can_grow = queue.candidates(limit=4, merge=True)
    assert (values(batch), can_grow) == ([[1], [2, 3]], False)


def test_a_batch_below_the_limit_can_still_grow(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    put(queue, loop, rows(1, 2))
    batch, can_grow = queue.candidates(limit=4, merge=True)
    assert (values(batch), can_grow) == ([[1, 2]], True)


def test_requests_whose_rows_differ_in_shape_are_passed_over(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    put(queue, loop, rows(1, width=2))
    put(queue, loop, rows(2, width=3))
    put(queue, loop, rows(3, width=2))
    batch, _ = queue.candidates(limit=4, merge=True)
    assert [chunk.inputs["x"][:, 0].tolist() for chunk in batch] == [[1], [3]]


def test_the_oldest_chunk_runs_even_when_larger_than_a_limit_lowered_since(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    put(queue, loop, rows(1, 2, 3, 4), limit=4)
    put(queue, loop, rows(5), limit=4)
    batch, can_grow = queue.candidates(limit=2, merge=True)
    assert (values(batch), can_grow) == ([[1, 2, 3, 4]], False)


def test_without_merging_the_oldest_chunk_runs_alone(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    put(queue, loop, rows(1))
    put(queue, loop, rows(2))
    batch, can_grow = queue.candidates(limit=4, merge=False)
    assert (values(batch), can_grow) == ([[1]], False)


def test_taking_a_batch_removes_its_chunks_and_frees_their_rows(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    put(queue, loop, rows(1, width=2))
    put(queue, loop, rows(2, width=3))
    put(queue, loop, rows(3, width=2))
    batch, _ = queue.candidates(limit=4, merge=True)
    queue.take(batch)
    assert queue.rows == 1
    assert [chunk.inputs["x"][:, 0].tolist() for chunk in queue.chunks] == [[2]]


# -- callers that went away ------------------------------------------------------------------------


def test_a_cancelled_chunk_leaves_the_queue_and_frees_its_rows(loop: asyncio.AbstractEventLoop) -> None:
    emptied: list[int] = []
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: emptied.append(queue.rows))
    abandoned = put(queue, loop, rows(1, 2))
    put(queue, loop, rows(3))
    abandoned[0].future.cancel()
    loop.run_until_complete(asyncio.sleep(0))  # the future's callbacks run in the loop's next turn
    assert (values(list(queue.chunks)), queue.rows, emptied) == ([[3]], 1, [1])


def test_a_cancelled_chunk_is_passed_over_before_it_leaves_the_queue(loop: asyncio.AbstractEventLoop) -> None:
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: None)
    abandoned = put(queue, loop, rows(1))
    put(queue, loop, rows(2))
    abandoned[0].future.cancel()
    batch, _ = queue.candidates(limit=4, merge=True)
    assert values(batch) == [[2]]


def test_a_chunk_taken_into_a_batch_no_longer_leaves_the_queue_when_cancelled(
    loop: asyncio.AbstractEventLoop,
) -> None:
    cancelled: list[bool] = []
    queue = RequestQueue("m", max_rows=100, on_cancelled=lambda: cancelled.append(True))
    taken = put(queue, loop, rows(1))
    queue.take(taken)
    taken[0].future.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    assert (queue.rows, cancelled) == (0, [])
