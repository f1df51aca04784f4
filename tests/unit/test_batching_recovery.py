"""The batches that need more than one backend call: split in halves on out of memory down to one
row, a failed merged call run again request by request, rows beyond a lowered limit in calls of the
limit. The backend call is given to ``Recovery`` as a function, here one that runs the model in
the test's own thread and records each call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import numpy as np
import pytest

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Arrays, Chunk, signature
from udfserve.services.model_server.core.batching.recovery import CallResult, Recovery
from udfserve.services.model_server.core.batching.row_limit import RowLimit

HUGE_ROW = 99.0
Predict = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def small_device(fits_rows: int) -> Predict:
    """Doubles ``x``; a call of more than ``fits_rows`` rows, or holding a huge row, is out of memory."""

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        if len(x) > fits_rows or (x == HUGE_ROW).any():
            raise DeviceOutOfMemory(f"out of memory running {len(x)} rows")
        return {"y": x * 2}

    return predict


def positive_only(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if (inputs["x"] < 0).any():
        raise ValueError("negative input")
    return {"y": inputs["x"] * 2}


class Calls:
    """The backend call ``Recovery`` makes, run inline; ``sizes`` records each call's rows."""

    def __init__(self, predict: Predict) -> None:
        self.predict = predict
        self.sizes: list[int] = []

    async def __call__(self, inputs: Arrays, rows: int, requests: int) -> CallResult:
        self.sizes.append(rows)
        try:
            return CallResult(self.predict(inputs), None, 0.001)
        except Exception as error:
            return CallResult(None, error, 0.001)


def run_batch(
    predict: Predict, requests: list[list[float]], *, max_batch_size: int = 8, limit_rows: int | None = None
) -> tuple[list[Chunk], Calls, RowLimit]:
    """Run one batch of these requests through a ``Recovery``; its chunks, calls and limit."""
    calls = Calls(predict)
    limit = RowLimit(max_batch_size, Reports("m", None))
    if limit_rows is not None:
        limit.on_split(fitted=[limit_rows], row_too_big=False)

    async def body() -> list[Chunk]:
        loop = asyncio.get_running_loop()
        chunks = []
        for number, values in enumerate(requests, start=1):
            inputs = {"x": np.array(values, dtype=np.float32)}
            future = loop.create_future()
            chunks.append(Chunk(inputs, len(values), signature(inputs), future, 0.0, 0, len(values), number))
        inputs = {"x": np.concatenate([chunk.inputs["x"] for chunk in chunks])}
        await Recovery("m", calls, limit, Reports("m", None)).run(chunks, inputs, len(inputs["x"]), None)
        return chunks

    return asyncio.run(body()), calls, limit


def answer(chunk: Chunk) -> list[float] | BaseException:
    error = chunk.future.exception()
    return error if error is not None else chunk.future.result()["y"].tolist()


def test_a_call_out_of_memory_is_split_in_halves_until_the_rows_fit() -> None:
    chunks, calls, _ = run_batch(small_device(fits_rows=2), [[1, 2], [3], [4]])
    assert [answer(chunk) for chunk in chunks] == [[2, 4], [6], [8]]
    assert calls.sizes == [4, 2, 2]


def test_the_limit_drops_to_the_largest_part_that_fitted() -> None:
    _, _, limit = run_batch(small_device(fits_rows=3), [[1, 2, 3, 4, 5, 6]])
    assert limit.rows == 3


def test_a_single_row_that_does_not_fit_fails_its_request_naming_the_row() -> None:
    chunks, calls, limit = run_batch(small_device(fits_rows=8), [[1], [2, HUGE_ROW], [4]])
    before, huge, after = (answer(chunk) for chunk in chunks)
    assert (before, after) == ([2], [8])
    assert isinstance(huge, DeviceOutOfMemory)
    assert str(huge).startswith(
        "model 'm': out of memory on a single row: row 1 of the request's 2 rows does not fit even alone"
    )
    assert limit.rows == 8  # the row was to blame, not the batch's size
    assert calls.sizes == [4, 2, 2, 1, 1]


def test_a_failed_merged_call_is_run_again_request_by_request_and_only_the_bad_one_fails() -> None:
    chunks, calls, _ = run_batch(positive_only, [[1], [-1], [2, 3]])
    good, bad, other = (answer(chunk) for chunk in chunks)
    assert (good, other) == ([2], [4, 6])
    assert isinstance(bad, BackendFault)
    assert str(bad) == "model 'm': backend failed: ValueError: negative input"
    assert calls.sizes == [4, 1, 1, 2]


def test_a_failed_call_of_one_request_is_not_run_again() -> None:
    chunks, calls, _ = run_batch(positive_only, [[1, -1]])
    assert isinstance(answer(chunks[0]), BackendFault)
    assert calls.sizes == [2]


def test_rows_beyond_a_lowered_limit_run_in_calls_of_the_limit() -> None:
    chunks, calls, _ = run_batch(small_device(fits_rows=8), [[1, 2, 3], [4, 5]], limit_rows=2)
    assert [answer(chunk) for chunk in chunks] == [[2, 4, 6], [8, 10]]
    assert calls.sizes == [2, 2, 1]


def test_a_call_already_made_for_the_whole_batch_is_not_made_again() -> None:
    calls = Calls(small_device(fits_rows=1))

    async def body() -> list[float] | BaseException:
        loop = asyncio.get_running_loop()
        inputs = {"x": np.array([1, 2], dtype=np.float32)}
        chunk = Chunk(inputs, 2, signature(inputs), loop.create_future(), 0.0, 0, 2, 1)
        failed = CallResult(None, DeviceOutOfMemory("out of memory running 2 rows"), 0.001)
        limit = RowLimit(8, Reports("m", None))
        await Recovery("m", calls, limit, Reports("m", None)).run([chunk], inputs, 2, failed)
        return answer(chunk)

    assert asyncio.run(body()) == [2, 4]
    assert calls.sizes == [1, 1]


@pytest.mark.parametrize("fits_rows", [1, 2, 3, 5, 8])
def test_every_row_is_answered_once_in_order_whatever_fits(fits_rows: int) -> None:
    requests = [[1, 2, 3], [4], [5, 6], [7, 8]]
    chunks, _, _ = run_batch(small_device(fits_rows), requests)
    assert [answer(chunk) for chunk in chunks] == [[2 * v for v in values] for values in requests]
