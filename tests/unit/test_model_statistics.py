"""Per-model statistics as the KServe statistics extension reports them (Triton's definitions):
fed by the same observations as the Prometheus series, from the request path and the batcher.
Queue and compute time count once per request the batcher answered, whatever it took: pieces of a
request larger than ``max_batch_size``, merged calls, calls split after running out of memory."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pytest

from udfserve.runtime.errors import DeviceOutOfMemory
from udfserve.runtime.model_config import BatchingConfig
from udfserve.services.model_server.core.batching import DynamicBatcher
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.observability.statistics import ModelStatistics

LONG_DELAY_S = 5.0
Predict = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def test_a_successful_request_counts_its_rows_and_its_time() -> None:
    statistics = ModelStatistics()
    statistics.on_request(True, 0.002, rows=7)
    proto = statistics.to_proto("m", 3)
    assert (proto.name, proto.version, proto.inference_count) == ("m", "3", 7)
    assert (proto.inference_stats.success.count, proto.inference_stats.success.ns) == (1, 2_000_000)
    assert proto.inference_stats.fail.count == 0


def test_a_failed_request_counts_as_a_failure_and_no_rows() -> None:
    statistics = ModelStatistics()
    statistics.on_request(False, 0.001, rows=0)
    proto = statistics.to_proto("m", 1)
    assert (proto.inference_stats.fail.count, proto.inference_stats.fail.ns) == (1, 1_000_000)
    assert (proto.inference_stats.success.count, proto.inference_count) == (0, 0)
    assert proto.last_inference == 0


def test_each_successful_call_is_an_execution_counted_by_its_rows() -> None:
    statistics = ModelStatistics()
    statistics.on_call(rows=12, seconds=0.004)
    statistics.on_call(rows=12, seconds=0.002)
    statistics.on_call(rows=5, seconds=0.001)
    proto = statistics.to_proto("m", 1)
    assert proto.execution_count == 3
    assert proto.last_inference > 0
    by_rows = {
        stat.batch_size: (stat.compute_infer.count, stat.compute_infer.ns) for stat in proto.batch_stats
    }
    assert by_rows == {5: (1, 1_000_000), 12: (2, 6_000_000)}


def test_input_and_output_conversion_are_counted_inside_the_model_call() -> None:
    statistics = ModelStatistics()
    statistics.on_answered(queue_s=0.0005, compute_s=0.001)
    statistics.on_answered(queue_s=0.0, compute_s=0.001)
    stats = statistics.to_proto("m", 1).inference_stats
    assert (stats.compute_infer.count, stats.compute_infer.ns) == (2, 2_000_000)
    assert (stats.queue.count, stats.queue.ns) == (2, 500_000)
    assert (stats.compute_input.count, stats.compute_input.ns) == (2, 0)
    assert (stats.compute_output.count, stats.compute_output.ns) == (2, 0)


def test_answered_requests_of_either_protocol_feed_the_statistics() -> None:
    metrics = ServerMetrics("cpu")
    model = metrics.for_model("m")
    model.observe_request("OK", 0.003, rows=4)
    model.observe_request("INVALID_ARGUMENT", 0.001, rows=0)
    stats = model.statistics.to_proto("m", 1)
    assert (stats.inference_count, stats.inference_stats.success.count, stats.inference_stats.fail.count) == (
        4,
        1,
        1,
    )


# -- fed by a real batcher ----------------------------------------------------------------------
def doubled(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"] * 2}


def failing(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise RuntimeError("the backend broke")


def fits_two_rows(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if len(inputs["x"]) > 2:
        raise DeviceOutOfMemory(f"model 'm': out of memory running {len(inputs['x'])} rows")
    return doubled(inputs)


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


def answered(
    predict: Predict, executor: concurrent.futures.Executor, max_batch_size: int, *requests: list[float]
) -> ModelStatistics:
    """The statistics after ``requests``, queued together, were answered by a batcher (a batch
    fills to ``max_batch_size`` rather than waiting for the delay)."""
    metrics = ServerMetrics("cpu")

    async def body() -> None:
        batcher = DynamicBatcher(
            "m",
            predict,
            max_batch_size=max_batch_size,
            config=BatchingConfig(max_queue_delay_s=LONG_DELAY_S),
            executor=executor,
            observer=metrics,
        )
        batcher.start()
        futures = [batcher.enqueue({"x": np.array(values, np.float32)}) for values in requests]
        await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop(grace_period_s=LONG_DELAY_S)

    asyncio.run(asyncio.wait_for(body(), timeout=30))
    return metrics.for_model("m").statistics


def calls_by_rows(statistics: ModelStatistics) -> dict[int, int]:
    return {rows: stat.count for rows, stat in statistics.calls_by_rows.items()}


def test_a_merged_call_is_one_execution_and_counts_its_time_for_each_request(executor) -> None:
    statistics = answered(doubled, executor, 3, [1.0], [2.0, 3.0])
    (call,) = statistics.calls_by_rows.values()
    assert (statistics.execution_count, calls_by_rows(statistics)) == (1, {3: 1})
    assert (statistics.queue.count, statistics.compute_infer.count) == (2, 2)
    assert statistics.compute_infer.ns == 2 * call.ns


def test_a_request_cut_into_pieces_counts_once_with_all_its_calls(executor) -> None:
    statistics = answered(doubled, executor, 2, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert (statistics.execution_count, calls_by_rows(statistics)) == (3, {2: 2, 1: 1})
    assert (statistics.queue.count, statistics.compute_infer.count) == (1, 1)
    assert statistics.compute_infer.ns == sum(stat.ns for stat in statistics.calls_by_rows.values())


def test_calls_split_after_running_out_of_memory_count_once_per_request(executor) -> None:
    statistics = answered(fits_two_rows, executor, 8, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0])
    assert (statistics.queue.count, statistics.compute_infer.count) == (3, 3)
    assert statistics.execution_count == sum(calls_by_rows(statistics).values())
    assert set(calls_by_rows(statistics)) <= {1, 2}


def test_a_failed_request_adds_no_execution_queue_or_compute(executor) -> None:
    statistics = answered(failing, executor, 2, [1.0])
    assert (statistics.execution_count, statistics.queue.count, statistics.compute_infer.count) == (0, 0, 0)
    assert statistics.calls_by_rows == {}
