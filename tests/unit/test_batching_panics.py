"""A backend call that raises what is not an ``Exception`` (a Rust panic, as PyO3 raises it) fails
its request FAILED_PRECONDITION, and the batcher goes on: before, the panic escaped the call's
completion callback and the batch stayed running for good, its slot never given back."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator, Mapping

import grpc
import numpy as np
import pytest

from udfserve.runtime.errors import STOPPING, ModelAborted, model_failure
from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher

SAFETY_TIMEOUT_S = 8.0
HOUR_S = 3600.0  # a grace period no test waits out: stop must find nothing running


class PanicException(BaseException):
    """What ``pyo3_runtime.PanicException`` is to Python: a ``BaseException``, not an ``Exception``."""


class PanicsOnNegatives:
    """Doubles ``x``; panics on a batch holding a negative value. Keeps the rows of each call."""

    def __init__(self) -> None:
        self.calls: list[list[float]] = []

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(inputs["x"].tolist())
        if (inputs["x"] < 0).any():
            raise PanicException("called `Option::unwrap()` on a `None` value")
        return {"y": inputs["x"] * 2}


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=True)


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


def batcher_of(backend: PanicsOnNegatives, executor: concurrent.futures.Executor) -> DynamicBatcher:
    batcher = DynamicBatcher(
        "m", backend, max_batch_size=8, config=BatchingConfig(max_queue_delay_s=0.0), executor=executor
    )
    batcher.start()
    return batcher


def test_a_call_that_panics_fails_its_request_failed_precondition_naming_the_model_and_the_panic(
    executor: concurrent.futures.ThreadPoolExecutor,
) -> None:
    async def body() -> ModelAborted:
        batcher = batcher_of(PanicsOnNegatives(), executor)
        with pytest.raises(ModelAborted) as raised:
            await batcher.submit(rows(-1.0))
        await batcher.stop(HOUR_S)
        return raised.value

    error = asyncio.run(asyncio.wait_for(body(), SAFETY_TIMEOUT_S))

    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'm' aborted on this input: PanicException: called `Option::unwrap()`" in error.message


def test_after_a_panic_the_next_request_is_answered(executor: concurrent.futures.ThreadPoolExecutor) -> None:
    async def body() -> list[float]:
        batcher = batcher_of(PanicsOnNegatives(), executor)
        with pytest.raises(ModelAborted):
            await batcher.submit(rows(-1.0))
        answer = await batcher.submit(rows(1.0, 2.0))
        await batcher.stop(HOUR_S)
        return list(answer["y"].tolist())

    assert asyncio.run(asyncio.wait_for(body(), SAFETY_TIMEOUT_S)) == [2.0, 4.0]


def test_a_panic_in_a_merged_batch_fails_only_the_request_that_caused_it(
    executor: concurrent.futures.ThreadPoolExecutor,
) -> None:
    backend = PanicsOnNegatives()

    async def body() -> list[object]:
        batcher = batcher_of(backend, executor)
        queued = [batcher.enqueue(rows(value)) for value in (1.0, -1.0, 3.0)]  # queued at once: merged
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        await batcher.stop(HOUR_S)
        return outcomes

    outcomes = asyncio.run(asyncio.wait_for(body(), SAFETY_TIMEOUT_S))

    assert [type(outcome).__name__ for outcome in outcomes] == ["dict", "ModelAborted", "dict"]
    assert backend.calls == [[1.0, -1.0, 3.0], [1.0], [-1.0], [3.0]]  # merged, then each alone


def test_stop_after_a_panic_finds_no_batch_running(executor: concurrent.futures.ThreadPoolExecutor) -> None:
    async def body() -> float:
        batcher = batcher_of(PanicsOnNegatives(), executor)
        with pytest.raises(ModelAborted):
            await batcher.submit(rows(-1.0))
        loop = asyncio.get_running_loop()
        started = loop.time()
        await batcher.stop(HOUR_S)
        return loop.time() - started

    assert asyncio.run(asyncio.wait_for(body(), SAFETY_TIMEOUT_S)) < 1.0


def test_a_panic_becomes_model_aborted_and_an_exception_stays_itself() -> None:
    error = ValueError("bad")

    assert model_failure(error, "m") is error
    assert isinstance(model_failure(PanicException("boom"), "m"), ModelAborted)


@pytest.mark.parametrize("stop", STOPPING)
def test_what_stops_a_thread_or_the_process_is_raised_again_not_taken_for_a_model_failure(
    stop: type[BaseException],
) -> None:
    with pytest.raises(stop):
        model_failure(stop(), "m")
