"""The bound on one model call: a call past it is stopped by the means its backend registered and
fails DEADLINE_EXCEEDED, the model going on; one that cannot be stopped breaks the model's batcher
(its requests UNAVAILABLE, the server told, to exit for a fresh process); a call within its bound
is left alone, and a bound of 0 watches nothing. The calls are real threads blocked on events the
stop sets, so each test waits for the event it means."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator, Mapping

import grpc
import numpy as np
import pytest

from udfserve.runtime.call_bound import STUCK_AFTER_S, CallWatch, on_overrun
from udfserve.runtime.errors import ModelCallTimeout
from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.errors import ModelUnavailable

SAFETY_TIMEOUT_S = 60.0
"""Safety limit of a wait for an event (far above the bounds the tests set)."""
BOUND_S = 0.2


class Stoppable:
    """A call that runs until its stop is called (``terminate``, as ONNX Runtime's run options)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def __call__(self) -> None:
        on_overrun(self.stopped.set)
        if not self.stopped.wait(SAFETY_TIMEOUT_S):
            raise AssertionError("the call was never stopped")
        raise RuntimeError("Exiting due to terminate flag being set to true.")


def test_a_call_past_its_bound_is_stopped_by_the_means_its_backend_registered() -> None:
    watch = CallWatch(stuck_after_s=SAFETY_TIMEOUT_S)
    call = Stoppable()
    with pytest.raises(RuntimeError, match="terminate"), watch.bounded(BOUND_S) as bounded:
        call()
    assert bounded.overran
    assert call.stopped.is_set()


def test_a_call_that_cannot_be_stopped_is_reported_stuck_naming_its_bound() -> None:
    watch = CallWatch(stuck_after_s=BOUND_S)
    reasons: list[str] = []
    reported = threading.Event()
    release = threading.Event()

    def on_stuck(reason: str) -> None:
        reasons.append(reason)
        reported.set()
        release.set()  # what a process exit would do to the thread

    with watch.bounded(BOUND_S, on_stuck) as bounded:
        assert release.wait(SAFETY_TIMEOUT_S), "the stuck call was never reported"
    assert bounded.overran
    assert reasons == [
        f"a model call ran past its bound of {BOUND_S:g} s and did not stop within {BOUND_S:g} s after"
    ]


def test_a_call_within_its_bound_is_neither_stopped_nor_reported() -> None:
    watch = CallWatch(stuck_after_s=BOUND_S)
    stops: list[str] = []
    with watch.bounded(SAFETY_TIMEOUT_S, stops.append) as bounded:
        on_overrun(lambda: stops.append("stopped"))
    assert not bounded.overran
    assert stops == []


def test_a_bound_of_zero_sets_no_deadline_and_starts_no_thread() -> None:
    watch = CallWatch()
    with watch.bounded(0.0) as bounded:
        on_overrun(lambda: None)
    assert not bounded.overran
    assert watch._thread is None


def test_stop_all_stops_every_running_call_that_can_be_stopped_bound_or_not() -> None:
    watch = CallWatch()
    calls = [Stoppable(), Stoppable()]
    started = [threading.Event(), threading.Event()]
    failures: list[BaseException] = []

    def run(index: int, bound_s: float) -> None:
        with watch.bounded(bound_s):
            on_overrun(calls[index].stopped.set)
            started[index].set()
            try:
                calls[index]()
            except RuntimeError as exc:
                failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(0, 0.0)),
        threading.Thread(target=run, args=(1, SAFETY_TIMEOUT_S)),
    ]
    for thread in threads:
        thread.start()
    assert all(event.wait(SAFETY_TIMEOUT_S) for event in started)
    assert watch.stop_all() == 2
    for thread in threads:
        thread.join(SAFETY_TIMEOUT_S)
    assert len(failures) == 2


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
    yield pool
    pool.shutdown(wait=False)


class LoopsOnNegatives:
    """Doubles ``x``; on a batch holding a negative value runs until stopped (or ``unstoppable``:
    until the test lets it go, as native code that takes no stop)."""

    def __init__(self, unstoppable: bool = False) -> None:
        self.unstoppable = unstoppable
        self.stopped = threading.Event()
        self.let_go = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["x"] < 0).any():
            if self.unstoppable:
                self.let_go.wait(SAFETY_TIMEOUT_S)
            else:
                on_overrun(self.stopped.set)
                self.stopped.wait(SAFETY_TIMEOUT_S)
            raise RuntimeError("the call ended")
        return {"y": inputs["x"] * 2}


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


def bounded_batcher(
    backend: LoopsOnNegatives, executor: concurrent.futures.Executor, broken: list[str]
) -> DynamicBatcher:
    batcher = DynamicBatcher(
        "looping",
        backend,
        max_batch_size=8,
        config=BatchingConfig(max_queue_delay_s=0.0),
        executor=executor,
        on_broken=broken.append,
        call_bound_s=BOUND_S,
    )
    batcher.start()
    return batcher


def test_a_stopped_call_fails_its_request_deadline_exceeded_and_the_model_serves_the_next(
    executor: concurrent.futures.ThreadPoolExecutor,
) -> None:
    backend = LoopsOnNegatives()
    broken: list[str] = []

    async def body() -> tuple[BaseException | None, dict[str, np.ndarray]]:
        batcher = bounded_batcher(backend, executor, broken)
        try:
            await asyncio.wait_for(batcher.submit(rows(-1.0)), SAFETY_TIMEOUT_S)
        except ModelCallTimeout as exc:
            failure: BaseException | None = exc
        else:
            failure = None
        answer = await asyncio.wait_for(batcher.submit(rows(3.0)), SAFETY_TIMEOUT_S)
        await batcher.stop(0.0)
        return failure, answer

    failure, answer = asyncio.run(body())
    assert isinstance(failure, ModelCallTimeout)
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"model 'looping': the call of 1 row(s) ran past the server's bound of {BOUND_S:g} s" in str(
        failure
    )
    assert answer["y"].tolist() == [6.0]
    assert broken == []


@pytest.mark.slow
def test_a_call_that_cannot_be_stopped_fails_what_the_model_holds_unavailable_and_breaks_it(
    executor: concurrent.futures.ThreadPoolExecutor,
) -> None:
    backend = LoopsOnNegatives(unstoppable=True)
    broken: list[str] = []

    async def body() -> tuple[BaseException, BaseException]:
        batcher = bounded_batcher(backend, executor, broken)
        stuck = batcher.enqueue(rows(-1.0))
        with pytest.raises(ModelUnavailable) as first:
            await asyncio.wait_for(stuck, STUCK_AFTER_S + SAFETY_TIMEOUT_S)
        with pytest.raises(ModelUnavailable) as later:
            await batcher.submit(rows(3.0))
        backend.let_go.set()
        await batcher.stop(0.0)
        return first.value, later.value

    first, later = asyncio.run(body())
    assert "ran past its bound of 0.2 s and did not stop" in str(first)
    assert "its batcher failed" in str(later)
    assert len(broken) == 1 and "did not stop within" in broken[0]
