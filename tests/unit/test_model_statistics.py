"""Per-model statistics as the KServe statistics extension reports them (Triton's definitions):
fed by the same observations as the Prometheus series, from the request path and the batcher."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from services.model_server.batching import DynamicBatcher
from services.model_server.config import BatchingConfig
from services.model_server.metrics import ServerMetrics
from services.model_server.statistics import NS_PER_S, ModelStatistics

LONG_DELAY_S = 5.0


def test_a_successful_request_counts_its_rows_and_its_time() -> None:
    statistics = ModelStatistics()
    statistics.on_request(True, 0.002, rows=7)
    proto = statistics.to_proto("m", 3)
    assert (proto.name, proto.version, proto.inference_count) == ("m", "3", 7)
    assert (proto.inference_stats.success.count, proto.inference_stats.success.ns) == (1, 2_000_000)
    assert proto.inference_stats.fail.count == 0
    assert proto.last_inference > 0


def test_a_failed_request_counts_as_a_failure_and_no_rows() -> None:
    statistics = ModelStatistics()
    statistics.on_request(False, 0.001, rows=0)
    proto = statistics.to_proto("m", 1)
    assert (proto.inference_stats.fail.count, proto.inference_stats.fail.ns) == (1, 1_000_000)
    assert (proto.inference_stats.success.count, proto.inference_count) == (0, 0)


def test_a_merged_call_counts_one_execution_and_its_duration_once_per_request() -> None:
    statistics = ModelStatistics()
    statistics.on_call(rows=12, requests=3, seconds=0.004)
    statistics.on_call(rows=12, requests=2, seconds=0.002)
    statistics.on_call(rows=5, requests=1, seconds=0.001)
    proto = statistics.to_proto("m", 1)
    assert proto.execution_count == 3
    infer = proto.inference_stats.compute_infer
    assert (infer.count, infer.ns) == (6, (3 * 4 + 2 * 2 + 1) * NS_PER_S // 1000)
    by_rows = {
        stat.batch_size: (stat.compute_infer.count, stat.compute_infer.ns) for stat in proto.batch_stats
    }
    assert by_rows == {5: (1, 1_000_000), 12: (2, 6_000_000)}


def test_input_and_output_conversion_are_counted_inside_the_model_call() -> None:
    statistics = ModelStatistics()
    statistics.on_call(rows=4, requests=2, seconds=0.001)
    stats = statistics.to_proto("m", 1).inference_stats
    assert (stats.compute_input.count, stats.compute_input.ns) == (2, 0)
    assert (stats.compute_output.count, stats.compute_output.ns) == (2, 0)


# -- fed by a real batcher ----------------------------------------------------------------------
def doubled(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"] * 2}


def failing(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise RuntimeError("the backend broke")


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


def run_batch(metrics: ServerMetrics, predict, executor, *requests: list[float]) -> None:
    """Queue ``requests`` together (one merged call, the batch filled to its limit) and wait."""

    async def body() -> None:
        rows = sum(len(values) for values in requests)
        batcher = DynamicBatcher(
            "m",
            predict,
            max_batch_size=rows,
            config=BatchingConfig(max_queue_delay_s=LONG_DELAY_S),
            executor=executor,
            observer=metrics,
        )
        batcher.start()
        futures = [batcher.enqueue({"x": np.array(values, np.float32)}) for values in requests]
        await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop(grace_period_s=LONG_DELAY_S)

    asyncio.run(asyncio.wait_for(body(), timeout=30))


def test_the_batcher_reports_queue_waits_and_a_merged_call_to_the_model_s_statistics(executor) -> None:
    metrics = ServerMetrics("cpu")
    run_batch(metrics, doubled, executor, [1.0], [2.0, 3.0])
    proto = metrics.for_model("m").statistics.to_proto("m", 1)
    assert proto.inference_stats.queue.count == 2
    assert proto.execution_count == 1
    assert proto.inference_stats.compute_infer.count == 2
    assert [(stat.batch_size, stat.compute_infer.count) for stat in proto.batch_stats] == [(3, 1)]


def test_a_failed_backend_call_is_no_execution(executor) -> None:
    metrics = ServerMetrics("cpu")
    run_batch(metrics, failing, executor, [1.0])
    proto = metrics.for_model("m").statistics.to_proto("m", 1)
    assert (proto.execution_count, proto.inference_stats.compute_infer.count, len(proto.batch_stats)) == (
        0,
        0,
        0,
    )


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


def test_a_newly_loaded_version_starts_its_statistics_from_zero() -> None:
    metrics = ServerMetrics("cpu")
    model = metrics.for_model("m")
    model.observe_request("OK", 0.003, rows=4)
    model.restart_statistics()
    assert model.statistics.to_proto("m", 2).inference_count == 0
