"""A batcher that breaks for good: it answers what it holds, refuses what comes and says why, once.

The fault is real: the batcher's executor is shut down, so ``submit`` raises as it does when no
thread can be started for a call; the batch that was starting is in the runner's hands by then."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping

import numpy as np
import pytest

from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.errors import ModelUnavailable

SAFETY_TIMEOUT_S = 8.0
HOUR_S = 3600.0  # a grace period no test waits out: stop must not wait for the broken batch


class GatedDoubler:
    """Doubles ``x``; each call waits for ``release`` once ``started`` is set."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.started.set()
        self.release.wait(timeout=SAFETY_TIMEOUT_S)
        return {"y": inputs["x"] * 2}


def rows(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, dtype=np.float32)}


def test_a_batcher_that_cannot_start_a_batch_answers_it_refuses_later_requests_and_reports_once() -> None:
    faults: list[str] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
    backend = GatedDoubler()

    async def body() -> None:
        batcher = DynamicBatcher(
            "m",
            backend,
            max_batch_size=1,
            config=BatchingConfig(max_queue_delay_s=0.0),
            executor=pool,
            on_broken=faults.append,
        )
        batcher.start()
        first = batcher.enqueue(rows(1.0))
        assert await asyncio.to_thread(backend.started.wait, SAFETY_TIMEOUT_S)
        queued = batcher.enqueue(rows(2.0))  # waits for the running batch: the only slot
        pool.shutdown(wait=False)  # from now on no call can start
        backend.release.set()

        assert (await first)["y"].tolist() == [2.0]
        failed = r"model 'm': its batcher failed \(starting a batch failed: RuntimeError: cannot schedule new"
        with pytest.raises(ModelUnavailable, match=failed):
            await queued
        with pytest.raises(ModelUnavailable, match=r"its batcher failed .*retry on another server"):
            batcher.enqueue(rows(3.0))
        await batcher.stop(HOUR_S)  # holds nothing: returns without waiting

    try:
        asyncio.run(asyncio.wait_for(body(), SAFETY_TIMEOUT_S))
    finally:
        pool.shutdown(wait=True)
    assert faults == ["starting a batch failed: RuntimeError: cannot schedule new futures after shutdown"]
