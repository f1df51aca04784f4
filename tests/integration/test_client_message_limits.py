"""Requests and the gRPC message limit, against a real server over TCP (payloads inline).

A request is cut to half the limit by its bytes, not only by the batch's average row: a few long
rows among short ones travel in smaller requests. A single row over the limit is the batch's
fault, refused with the limit named, never counted against the server nor handed to the CPU.
"""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pytest
from server_harness import module_server

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import RequestRejected
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.executor.rechunk import Rechunker
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.protocols import describe_model

LIMIT = 1 << 20
MODEL = "text_hashing"

server = module_server("message-limits", ["--max-message-bytes", str(LIMIT), "--models", MODEL], port=0)


def answer(
    server: ServerProcess,
    batches: list[pa.RecordBatch],
    protocol: Literal["arrow", "kserve"],
    stats: ClientStats,
) -> list[pa.RecordBatch]:
    """The partition runner over ``batches``, cut by the rechunker as a UDF's partition is. The
    CPU fallback is on but has no repository: taking it would fail the test."""
    assert server.tcp_address is not None
    config = ClientConfig(
        address=server.tcp_address,
        protocol=protocol,
        max_message_bytes=LIMIT,
        model_repository="/nonexistent-repository",
    )
    job = PredictJob(MODEL, describe_model(server.tcp_address, config, MODEL).spec, config)
    rechunker: Rechunker[int] = Rechunker(config.rows_per_request, LIMIT, job.spec.empty_outputs())
    answers = predict_partition(
        job,
        rechunker.requests(enumerate(batches)),
        {},
        TaskPlacement(),
        stats=stats,
        breakers=CircuitBreakers(),
    )
    return [batch for _, batch in rechunker.answers(answers)]


def texts(lengths: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(["x" * n for n in lengths], pa.string())], names=["text"])


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_few_long_rows_among_short_ones_are_sent_in_requests_under_the_limit(
    server: ServerProcess, protocol: Literal["arrow", "kserve"]
) -> None:
    lengths = [10] * 1_000
    for row in (10, 200, 400):
        lengths[row] = 400 << 10  # on average 1.2 KiB per row; 1.2 MiB in the first 422 rows
    stats = ClientStats()
    answered = answer(server, [texts(lengths), texts([10] * 1_000)], protocol, stats)
    assert [batch.num_rows for batch in answered] == [1_000, 1_000]
    assert stats.server_failures == {}
    assert (stats.rows_by_server, stats.rows_by_fallback) == (2_000, 0)


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_row_over_the_message_limit_is_refused_naming_the_limit_and_the_server_is_not_blamed(
    server: ServerProcess, protocol: Literal["arrow", "kserve"]
) -> None:
    stats = ClientStats()
    with pytest.raises(RequestRejected) as refused:
        answer(server, [texts([10, 2 << 20, 10])], protocol, stats)
    message = str(refused.value)
    assert "was too large to send" in message
    assert "max_message_bytes (1,048,576)" in message
    assert "--max-message-bytes" in message
    assert stats.server_failures == {}
    assert stats.rows_by_fallback == 0
