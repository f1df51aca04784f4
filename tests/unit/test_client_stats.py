"""Client statistics: filled per task, summed field by field as Spark sums accumulators."""

from __future__ import annotations

from udfserve.spark_client.observability.stats import ClientStats, ClientStatsParam
from udfserve.spark_client.wire.transport import StreamCounters


def task_on_server_then_cpu() -> ClientStats:
    stats = ClientStats()
    stats.add_stream(
        "unix:///run/gpu0.sock",
        StreamCounters(answered=3, rows=3_000, resent=2, backoff_waits=2, backoff_s=0.03),
    )
    stats.add_answered(2_000, 1)
    stats.add_answered(1_000, 2)  # the server switched to version 2 mid-partition
    stats.add_server_failure("stream_error:UNAVAILABLE")
    for rows in (1_000, 500):
        stats.add_fallback(rows, "stream_error:UNAVAILABLE", 2)
        stats.add_answered(rows, 2)
    return stats


def test_a_task_counts_rows_batches_and_reasons_by_path() -> None:
    stats = task_on_server_then_cpu()
    assert (stats.rows_by_server, stats.rows_by_fallback, stats.rows) == (3_000, 1_500, 4_500)
    assert (stats.batches_by_server, stats.batches_by_fallback, stats.retries, stats.backoff_waits) == (
        3,
        2,
        2,
        2,
    )
    assert stats.fallback_reasons == {"stream_error:UNAVAILABLE": 2}
    assert stats.server_failures == {"stream_error:UNAVAILABLE": 1}
    assert stats.rows_by_address == {"unix:///run/gpu0.sock": 3_000}


def test_the_accumulator_sums_tasks_field_by_field_from_an_empty_zero() -> None:
    param = ClientStatsParam()
    total = param.zero(ClientStats(rows_by_server=7))
    assert total == ClientStats()
    for _ in range(2):
        total = param.addInPlace(total, task_on_server_then_cpu())
    assert (total.rows_by_server, total.rows_by_fallback, total.batches_by_fallback) == (6_000, 3_000, 4)
    assert total.fallback_reasons == {"stream_error:UNAVAILABLE": 4}
    assert total.rows_by_address == {"unix:///run/gpu0.sock": 6_000}


def test_rows_are_counted_by_the_version_that_computed_them_and_summed_across_tasks() -> None:
    stats = task_on_server_then_cpu()
    assert stats.rows_by_version == {1: 2_000, 2: 2_500}
    assert stats.fallback_rows_by_version == {2: 1_500}
    total = ClientStatsParam().addInPlace(task_on_server_then_cpu(), task_on_server_then_cpu())
    assert total.rows_by_version == {1: 4_000, 2: 5_000}
    assert total.fallback_rows_by_version == {2: 3_000}
    assert sum(total.rows_by_version.values()) == total.rows
