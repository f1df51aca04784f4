"""What a request is answered with: each call's outputs checked, a request's parts joined in row
order (or refused when their shapes differ), a backend's error as the caller gets it, and the one
future of a request cut into chunks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from udfserve.runtime.errors import BackendFault, InvalidInput
from udfserve.services.model_server.core.batching.answers import (
    as_serving_error,
    check_outputs,
    joined,
    resolve,
    whole_request,
)
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Chunk, signature
from udfserve.services.model_server.core.batching.row_limit import RowLimit
from udfserve.services.model_server.errors import QueueFull


class Answers:
    def __init__(self) -> None:
        self.answered: list[tuple[float, float]] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        pass

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        pass

    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        self.answered.append((queue_s, compute_s))


def chunks_of(loop: asyncio.AbstractEventLoop, *sizes: int) -> list[Chunk]:
    """The chunks of one request of ``sum(sizes)`` rows."""
    chunks, first_row = [], 0
    for size in sizes:
        inputs = {"x": np.zeros(size, np.float32)}
        future = loop.create_future()
        chunks.append(Chunk(inputs, size, signature(inputs), future, 0.0, first_row, sum(sizes), 1))
        first_row += size
    return chunks


def let_callbacks_run(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


# -- outputs ---------------------------------------------------------------------------------------


def test_outputs_with_one_row_per_input_row_pass() -> None:
    check_outputs("m", {"y": np.zeros((3, 2)), "z": np.zeros(3)}, rows=3)


def test_an_output_with_another_row_count_is_a_backend_fault_naming_it() -> None:
    with pytest.raises(BackendFault, match=r"model 'm': backend output 'z' has 2 rows; expected 3, one per"):
        check_outputs("m", {"y": np.zeros(3), "z": np.zeros(2)}, rows=3)


def test_a_scalar_output_is_a_backend_fault_naming_it() -> None:
    with pytest.raises(
        BackendFault, match=r"backend output 'y' is ndarray \(\); expected an array with 3 rows"
    ):
        check_outputs("m", {"y": np.ones(())}, rows=3)


def test_the_part_of_a_request_that_ran_in_one_call_is_its_answer_as_it_is() -> None:
    part = {"y": np.arange(3)}
    assert joined("m", [part], request_rows=3, limit_rows=4) is part


def test_parts_from_several_calls_are_joined_in_row_order() -> None:
    parts = [{"y": np.array([1, 2])}, {"y": np.array([3])}]
    assert joined("m", parts, request_rows=3, limit_rows=2)["y"].tolist() == [1, 2, 3]


def test_parts_whose_rows_differ_in_shape_are_refused_naming_the_output_and_the_shapes() -> None:
    parts = [{"y": np.zeros((2, 5))}, {"y": np.zeros((1, 2))}]
    with pytest.raises(InvalidInput) as caught:
        joined("m", parts, request_rows=3, limit_rows=2)
    assert str(caught.value).startswith(
        "model 'm': output 'y' came back with rows of shape (2,) and (5,) from the calls this request's "
        "3 rows ran in (the model runs at most 2 rows at once"
    )


# -- errors ----------------------------------------------------------------------------------------


def test_a_serving_error_reaches_the_caller_as_it_is() -> None:
    refusal = QueueFull("model 'm': queue full")
    assert as_serving_error("m", refusal) is refusal


def test_any_other_error_becomes_a_backend_fault_with_its_type_and_text() -> None:
    fault = as_serving_error("m", KeyError("x"))
    assert isinstance(fault, BackendFault)
    assert str(fault) == "model 'm': backend failed: KeyError: 'x'"


# -- answering chunks ------------------------------------------------------------------------------


def test_a_chunk_whose_caller_went_away_is_not_answered_nor_reported(loop: asyncio.AbstractEventLoop) -> None:
    observer = Answers()
    (chunk,) = chunks_of(loop, 2)
    chunk.future.cancel()
    resolve(chunk, {"y": np.zeros(2)}, 0.001, Reports("m", observer))
    assert chunk.future.cancelled()
    assert observer.answered == []


def test_a_chunk_that_is_its_whole_request_is_reported_when_answered(loop: asyncio.AbstractEventLoop) -> None:
    observer = Answers()
    (chunk,) = chunks_of(loop, 2)
    resolve(chunk, {"y": np.zeros(2)}, 0.25, Reports("m", observer))
    assert chunk.future.result()["y"].shape == (2,)
    assert [compute_s for _, compute_s in observer.answered] == [0.25]


def test_a_request_cut_into_chunks_is_answered_joined_and_reported_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    observer = Answers()
    reports = Reports("m", observer)
    chunks = chunks_of(loop, 2, 1)
    whole = whole_request(loop, chunks, RowLimit(2, reports), reports)
    resolve(chunks[1], {"y": np.array([3])}, 0.5, reports)
    resolve(chunks[0], {"y": np.array([1, 2])}, 0.25, reports)
    let_callbacks_run(loop)
    assert whole.result()["y"].tolist() == [1, 2, 3]
    assert [compute_s for _, compute_s in observer.answered] == [0.75]


def test_a_failed_chunk_fails_its_whole_request_and_cancels_the_chunks_not_run(
    loop: asyncio.AbstractEventLoop,
) -> None:
    reports = Reports("m", None)
    chunks = chunks_of(loop, 2, 2, 1)
    whole = whole_request(loop, chunks, RowLimit(2, reports), reports)
    chunks[1].future.set_exception(BackendFault("model 'm': backend failed"))
    let_callbacks_run(loop)
    with pytest.raises(BackendFault, match="backend failed"):
        whole.result()
    let_callbacks_run(loop)
    assert chunks[0].future.cancelled() and chunks[2].future.cancelled()


def test_cancelling_a_request_cancels_its_chunks(loop: asyncio.AbstractEventLoop) -> None:
    reports = Reports("m", None)
    chunks = chunks_of(loop, 2, 2)
    whole = whole_request(loop, chunks, RowLimit(2, reports), reports)
    whole.cancel()
    let_callbacks_run(loop)
    assert all(chunk.future.cancelled() for chunk in chunks)


def test_a_request_whose_chunks_came_back_in_different_shapes_is_refused_naming_the_limit(
    loop: asyncio.AbstractEventLoop,
) -> None:
    reports = Reports("m", None)
    chunks = chunks_of(loop, 2, 1)
    whole = whole_request(loop, chunks, RowLimit(2, reports), reports)
    resolve(chunks[0], {"y": np.zeros((2, 5))}, 0.0, reports)
    resolve(chunks[1], {"y": np.zeros((1, 2))}, 0.0, reports)
    let_callbacks_run(loop)
    with pytest.raises(InvalidInput, match="send at most 2 rows per request"):
        whole.result()
