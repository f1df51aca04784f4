"""The runner: a batch runs as one backend call in the executor and each of its chunks gets its own
rows back from the call's completion callback; a batch that needs more goes on in a task. Batches
are held in flight with a ``threading.Event`` gate, never with sleeps."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import pytest

from udfserve.runtime.errors import BackendFault
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Chunk, signature
from udfserve.services.model_server.core.batching.row_limit import RowLimit
from udfserve.services.model_server.core.batching.runner import Batch, BatchRunner

T = TypeVar("T")
SAFETY_TIMEOUT_S = 8.0
Predict = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def run(test: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), timeout=SAFETY_TIMEOUT_S)

    return asyncio.run(bounded())


def doubled(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"] * 2}


class Recorder:
    def __init__(self) -> None:
        self.waits = 0
        self.batches: list[tuple[int, int, bool]] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        self.waits += 1

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.batches.append((rows, requests, succeeded))


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=True)


class Runs:
    """A runner on the running loop; ``finished`` records the batches it finished, in order."""

    def __init__(
        self,
        predict: Predict,
        executor: concurrent.futures.Executor,
        *,
        max_batch_size: int = 8,
        observer: Recorder | None = None,
        limit_class: type[RowLimit] = RowLimit,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.limit = limit_class(max_batch_size, Reports("m", observer))
        self.running: set[Batch] = set()
        self.finished: list[Batch] = []
        self.all_finished = asyncio.Event()
        self.runner = BatchRunner(
            "m", predict, executor, self.limit, Reports("m", observer), self.running, self._on_finished
        )
        self.runner.bind(self.loop)
        self._requests = 0

    def _on_finished(self, batch: Batch) -> None:
        self.finished.append(batch)
        if not self.running:
            self.all_finished.set()

    def chunk(self, *values: float) -> Chunk:
        self._requests += 1
        inputs = {"x": np.array(values, dtype=np.float32)}
        rows = len(values)
        return Chunk(
            inputs,
            rows,
            signature(inputs),
            self.loop.create_future(),
            self.loop.time(),
            0,
            rows,
            self._requests,
        )

    def start(self, chunks: list[Chunk]) -> Batch:
        self.runner.start(chunks)
        (batch,) = [batch for batch in self.running if batch.chunks is chunks]
        return batch


def y(chunk: Chunk) -> list[float]:
    return chunk.future.result()["y"].tolist()


def test_a_batch_one_call_answers_gets_each_chunk_its_own_rows_without_a_task(
    executor: concurrent.futures.Executor,
) -> None:
    async def body() -> None:
        runs = Runs(doubled, executor)
        chunks = [runs.chunk(1), runs.chunk(2, 3), runs.chunk(4)]
        batch = runs.start(chunks)
        await asyncio.gather(*(chunk.future for chunk in chunks))
        assert [y(chunk) for chunk in chunks] == [[2], [4, 6], [8]]
        assert batch.task is None

    run(body)


def test_a_batch_is_finished_once_after_every_chunk_is_answered(
    executor: concurrent.futures.Executor,
) -> None:
    gate = threading.Event()

    def gated(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        gate.wait(timeout=SAFETY_TIMEOUT_S)
        return doubled(inputs)

    async def body() -> None:
        runs = Runs(gated, executor)
        chunks = [runs.chunk(1), runs.chunk(2)]
        batch = runs.start(chunks)
        assert (runs.running, runs.finished) == ({batch}, [])
        gate.set()
        await runs.all_finished.wait()
        assert runs.finished == [batch]
        assert all(chunk.future.done() for chunk in chunks)

    run(body)


def test_the_observer_sees_each_chunks_wait_and_the_call(executor: concurrent.futures.Executor) -> None:
    observer = Recorder()

    async def body() -> None:
        runs = Runs(doubled, executor, observer=observer)
        runs.start([runs.chunk(1), runs.chunk(2, 3)])
        await runs.all_finished.wait()

    run(body)
    assert (observer.waits, observer.batches) == (2, [(3, 2, True)])


class BrokenLimit(RowLimit):
    """A fault of ours on the answer path of a successful call."""

    def on_success(self, rows: int) -> None:
        raise RuntimeError("row limit bug")


def test_a_fault_on_the_answer_path_fails_the_batchs_requests_and_finishes_it(
    executor: concurrent.futures.Executor,
) -> None:
    async def body() -> None:
        runs = Runs(doubled, executor, limit_class=BrokenLimit)
        chunks = [runs.chunk(1), runs.chunk(2, 3)]
        batch = runs.start(chunks)
        await runs.all_finished.wait()
        assert runs.finished == [batch]
        for chunk in chunks:
            with pytest.raises(BackendFault, match="model 'm': answering the batch failed"):
                await chunk.future

    run(body)


def test_an_output_without_one_row_per_input_row_fails_the_request(
    executor: concurrent.futures.Executor,
) -> None:
    def short(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"][1:]}

    async def body() -> None:
        runs = Runs(short, executor)
        chunk = runs.chunk(1, 2)
        runs.start([chunk])
        with pytest.raises(BackendFault, match="model 'm': backend output 'y' has 1 rows; expected 2"):
            await chunk.future

    run(body)


def test_an_output_that_is_not_an_array_fails_the_request(executor: concurrent.futures.Executor) -> None:
    def listed(inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {"y": inputs["x"].tolist()}

    async def body() -> None:
        runs = Runs(listed, executor)
        chunk = runs.chunk(1, 2)
        runs.start([chunk])
        with pytest.raises(BackendFault, match="backend output 'y' is list ; expected an array with 2 rows"):
            await chunk.future

    run(body)


def test_a_failed_merged_call_goes_on_in_a_task_that_fails_only_the_bad_request(
    executor: concurrent.futures.Executor,
) -> None:
    def positive_only(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return doubled(inputs)

    async def body() -> None:
        runs = Runs(positive_only, executor)
        good, bad = runs.chunk(1), runs.chunk(-1)
        runs.start([good, bad])
        await runs.all_finished.wait()
        assert runs.finished[0].task is not None
        assert y(good) == [2]
        with pytest.raises(BackendFault, match="backend failed: ValueError: negative input"):
            bad.future.result()

    run(body)


def test_a_batch_larger_than_a_limit_lowered_since_runs_in_calls_of_the_limit(
    executor: concurrent.futures.Executor,
) -> None:
    sizes: list[int] = []

    def recorded(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sizes.append(len(inputs["x"]))
        return doubled(inputs)

    async def body() -> None:
        runs = Runs(recorded, executor, max_batch_size=8)
        chunk = runs.chunk(*range(8))
        runs.limit.on_split(fitted=[3], row_too_big=False)
        runs.start([chunk])
        await chunk.future
        assert y(chunk) == [2.0 * v for v in range(8)]

    run(body)
    assert sizes == [3, 3, 2]
