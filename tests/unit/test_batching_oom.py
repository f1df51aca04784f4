"""The batcher when the backend runs out of device memory: split in halves down to one row, every
row answered exactly once and in order, a lower batch limit for later batches, additive recovery.

The backend here raises ``DeviceOutOfMemory``, which is what a backend raises for the framework's
own resource-exhausted error (the TensorFlow mapping is tested in ``tests/backend``, a genuine
in-graph out-of-memory in ``tests/integration/test_backend_oom.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput
from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import LIMIT_RECOVERY_CALLS, DynamicBatcher

T = TypeVar("T")
LONG_DELAY_S = 10.0  # a batch fills up rather than waiting for the delay
SAFETY_TIMEOUT_S = 8.0
HUGE_ROW = 99.0  # a row holding this value does not fit in memory even alone


def run(test: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), timeout=SAFETY_TIMEOUT_S)

    return asyncio.run(bounded())


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


def y(result: dict[str, np.ndarray]) -> list[float]:
    return result["y"].tolist()


class SmallDevice:
    """Doubles ``x``; a call of more than ``fits_rows`` rows, or holding a huge row, is out of memory."""

    def __init__(self, fits_rows: int) -> None:
        self.fits_rows = fits_rows
        self.calls: list[tuple[int, bool]] = []  # (rows, succeeded)
        self._lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        fits = len(x) <= self.fits_rows and not (x == HUGE_ROW).any()
        with self._lock:
            self.calls.append((len(x), fits))
        if not fits:
            raise DeviceOutOfMemory(f"model 'm': out of memory running {len(x)} rows: OOM when allocating")
        return {"y": x * 2}

    @property
    def call_sizes(self) -> list[int]:
        return [size for size, _ in self.calls]


class MemoryRecorder:
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.succeeded: list[bool] = []
        self.out_of_memory: list[int] = []
        self.limits: list[int] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        pass

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.batches.append(rows)
        self.succeeded.append(succeeded)

    def on_out_of_memory(self, model: str, rows: int) -> None:
        self.out_of_memory.append(rows)

    def on_batch_limit(self, model: str, rows: int) -> None:
        self.limits.append(rows)


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=True)


def batcher(
    predict: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    executor: concurrent.futures.Executor,
    *,
    max_batch_size: int = 8,
    delay_s: float = LONG_DELAY_S,
    observer: MemoryRecorder | None = None,
    max_queue_rows: int | None = None,
) -> DynamicBatcher:
    started = DynamicBatcher(
        "m",
        predict,
        max_batch_size=max_batch_size,
        config=BatchingConfig(max_queue_delay_s=delay_s),
        executor=executor,
        observer=observer,
        max_queue_rows=max_queue_rows,
    )
    started.start()
    return started


def test_a_batch_that_runs_out_of_memory_is_split_in_halves_and_every_row_answered_in_order(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=3)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=8)
        results = await asyncio.gather(*(b.submit(rows(2 * i, 2 * i + 1)) for i in range(4)))
        assert [y(r) for r in results] == [[0, 2], [4, 6], [8, 10], [12, 14]]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    # 8 -> out of memory; 4 -> out of memory; 2 fits and becomes the limit; the rest runs in 2s.
    assert device.calls == [(8, False), (4, False), (2, True), (2, True), (2, True), (2, True)]


def test_later_batches_run_at_the_lowered_limit_without_running_out_of_memory(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=5)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=16, delay_s=0.0)
        assert y(await b.submit(rows(*range(16)))) == [2.0 * v for v in range(16)]
        assert b.batch_limit == 4
        device.calls.clear()
        assert y(await b.submit(rows(*range(10)))) == [2.0 * v for v in range(10)]
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert device.calls == [(4, True), (4, True), (2, True)]


def test_a_single_row_that_does_not_fit_fails_its_request_naming_the_model_and_the_row(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=8)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=6)
        before, huge, after = await asyncio.gather(
            b.submit(rows(1, 2)), b.submit(rows(3, HUGE_ROW, 5)), b.submit(rows(6)), return_exceptions=True
        )
        assert isinstance(before, dict) and y(before) == [2, 4]
        assert isinstance(after, dict) and y(after) == [12]
        assert isinstance(huge, DeviceOutOfMemory)
        assert huge.code.name == "RESOURCE_EXHAUSTED"
        assert "model 'm'" in huge.message and "row 1 of the request's 3 rows" in huge.message
        assert "OOM when allocating" in huge.message
        # A row too big to fit alone is not the batch size's fault: the limit stays.
        assert b.batch_limit == 6
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert device.calls == [(6, False), (3, True), (3, False), (2, False), (1, False), (1, True), (1, True)]


def test_a_request_that_never_fits_leaves_the_limit_unchanged(executor: concurrent.futures.Executor) -> None:
    device = SmallDevice(fits_rows=8)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=8, delay_s=0.0)
        with pytest.raises(DeviceOutOfMemory, match="row 0 of the request's 1 rows"):
            await b.submit(rows(HUGE_ROW))
        assert b.batch_limit == 8
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_a_batch_too_large_and_holding_a_row_too_big_lowers_the_limit_to_what_fitted(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=4)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=16)
        fine, huge = await asyncio.gather(
            b.submit(rows(*range(12))), b.submit(rows(12, 13, HUGE_ROW, 15)), return_exceptions=True
        )
        assert isinstance(fine, dict) and y(fine) == [2.0 * v for v in range(12)]
        assert isinstance(huge, DeviceOutOfMemory) and "row 2 of the request's 4 rows" in huge.message
        assert b.batch_limit == 4
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert device.call_sizes == [16, 8, 4, 4, 4, 4, 2, 2, 1, 1]


def test_another_failure_inside_a_split_half_fails_only_its_own_request(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=4)

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if len(inputs["x"]) <= 4 and (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return device(inputs)

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=7)
        first, bad, last = await asyncio.gather(
            b.submit(rows(1, 2, 3)), b.submit(rows(-1)), b.submit(rows(4, 5, 6)), return_exceptions=True
        )
        assert isinstance(first, dict) and y(first) == [2, 4, 6]
        assert isinstance(last, dict) and y(last) == [8, 10, 12]
        assert isinstance(bad, BackendFault) and not isinstance(bad, DeviceOutOfMemory)
        assert "negative input" in bad.message
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_the_limit_grows_one_step_after_enough_full_calls_in_a_row(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=2)

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=32, delay_s=0.0)
        await b.submit(rows(0, 1, 2))  # 3 rows: out of memory; 2 fit and become the limit; 1 more
        assert b.batch_limit == 2
        device.fits_rows = 32  # the memory is free again
        for _ in range(LIMIT_RECOVERY_CALLS - 1):
            await b.submit(rows(1, 2))
            await b.submit(rows(3))  # smaller than the limit: proves nothing, does not count
        assert b.batch_limit == 2
        await b.submit(rows(1, 2))
        assert b.batch_limit == 4  # grows by max_batch_size // 16
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)


def test_the_observer_sees_each_out_of_memory_call_and_each_limit(
    executor: concurrent.futures.Executor,
) -> None:
    device = SmallDevice(fits_rows=2)
    observer = MemoryRecorder()

    async def body() -> None:
        b = batcher(device, executor, max_batch_size=8, delay_s=0.0, observer=observer)
        await b.submit(rows(*range(8)))
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
    assert observer.out_of_memory == [8, 4]
    assert observer.limits == [8, 2]
    assert observer.batches == [8, 4, 2, 2, 2, 2]
    assert observer.succeeded == [False, False, True, True, True, True]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=8),
    fits_rows=st.integers(min_value=1, max_value=16),
    max_batch_size=st.integers(min_value=1, max_value=16),
    huge=st.sets(st.integers(min_value=0, max_value=60), max_size=3),
)
def test_every_row_is_answered_exactly_once_in_order_whatever_fits(
    sizes: list[int], fits_rows: int, max_batch_size: int, huge: set[int]
) -> None:
    """Requests get their own rows doubled, in order, unless they hold a row too big to fit alone."""
    device = SmallDevice(fits_rows=fits_rows)
    requests, first = [], 0
    for size in sizes:
        values = [HUGE_ROW if first + i in huge else float(first + i) for i in range(size)]
        requests.append(values)
        first += size

    async def body() -> list[object]:
        b = batcher(device, pool, max_batch_size=max_batch_size, delay_s=0.001, max_queue_rows=sum(sizes))
        answers = await asyncio.gather(
            *(b.submit(rows(*values)) for values in requests), return_exceptions=True
        )
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)
        return answers

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        answers = run(body)
    for values, answer in zip(requests, answers, strict=True):
        if HUGE_ROW in values:
            assert isinstance(answer, DeviceOutOfMemory), answer
            assert f"row {values.index(HUGE_ROW)} of the request's {len(values)} rows" in answer.message
        else:
            assert isinstance(answer, dict), answer
            assert y(answer) == [2 * v for v in values]


def test_a_request_split_into_outputs_of_different_shapes_fails_alone_and_its_partner_is_answered(
    executor: concurrent.futures.ThreadPoolExecutor,
) -> None:
    """Out of memory above two rows, each row's output padded to the longest of its call: the
    3-row request ends up in two calls of different widths, the 1-row request beside it in one."""

    def predict(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        lengths = inputs["x"].astype(int)
        if len(lengths) > 2:
            raise DeviceOutOfMemory(f"model 'm': out of memory running {len(lengths)} rows")
        return {"tokens": np.ones((len(lengths), int(lengths.max())), dtype=np.int64)}

    async def body() -> None:
        b = batcher(predict, executor, max_batch_size=4)
        spanning, partner = await asyncio.gather(
            b.submit(rows(1, 2, 5)), b.submit(rows(1)), return_exceptions=True
        )
        assert isinstance(spanning, InvalidInput)
        assert "output 'tokens' came back with rows of shape (2,) and (5,)" in str(spanning)
        assert "send at most 2 rows per request" in str(spanning)
        assert isinstance(partner, dict) and partner["tokens"].shape == (1, 5)
        await b.stop(grace_period_s=SAFETY_TIMEOUT_S)

    run(body)
