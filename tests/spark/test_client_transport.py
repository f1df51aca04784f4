"""The Predict stream against a real server whose queue is kept full: back-off, not failure.

No Spark here: the partition runner is driven directly with Arrow batches, so the test can
count the resends. The servers (conftest.py) run a genuinely slow model behind a queue of one
1,000-row request. ``throttled_server`` refuses what does not fit (``--room-wait-s 0``): of the
six requests in flight, one runs, one waits, and the others are answered RESOURCE_EXHAUSTED
until the call ends. ``holding_server`` serves as by default: the request that does not fit
waits in the server until the queue has room, and the stream is read no further meanwhile.
"""

from __future__ import annotations

import urllib.request

import numpy as np
import pyarrow as pa
import pytest
from spark_data import feature_values

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ServerUnavailable
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.channels import connect

MODEL = "slow_sum"


def requests(ids: np.ndarray, rows_per_request: int) -> list[pa.RecordBatch]:
    column = pa.FixedSizeListArray.from_arrays(pa.array(feature_values(ids, (4,)).reshape(-1)), 4)
    batch = pa.RecordBatch.from_arrays([column], names=["features"])
    return [batch.slice(start, rows_per_request) for start in range(0, len(ids), rows_per_request)]


def job_for(server: ServerProcess, **settings: object) -> PredictJob:
    config = ClientConfig.model_validate(
        {"address": server.grpc_target(), "max_in_flight": 6, "fallback": "error", **settings}
    )
    _, spec = connect(server.grpc_target(), config, MODEL)
    return PredictJob(MODEL, spec, config)


def refused_requests(server: ServerProcess) -> float:
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("udfserve_requests_total{") and 'code="RESOURCE_EXHAUSTED"' in line
    )


def room_waits(server: ServerProcess) -> float:
    """Requests the server held until its model's queue had room, so far."""
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    prefix = f'udfserve_queue_room_wait_seconds_count{{model="{MODEL}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_a_full_queue_is_waited_out_and_every_batch_answered_in_order(
    throttled_server: ServerProcess,
) -> None:
    """The CPU fallback is on (its repository does not exist, so taking it would fail the test,
    and this process never imports TensorFlow): the client waits instead."""
    ids = np.arange(6_000)
    refused_before = refused_requests(throttled_server)
    job = job_for(throttled_server, fallback="cpu", model_repository="/nonexistent-repository")
    stats = ClientStats()
    answers = list(
        predict_partition(
            job, iter(requests(ids, 1_000)), {}, TaskPlacement(), stats=stats, breakers=CircuitBreakers()
        )
    )
    refused = refused_requests(throttled_server) - refused_before
    assert refused > 0
    assert stats.backoff_waits == refused and stats.retries == refused
    assert (stats.rows_by_server, stats.rows_by_fallback, stats.server_failures) == (6_000, 0, {})
    predicted = np.concatenate([a.column(0).to_numpy() for a in answers])
    np.testing.assert_allclose(predicted, 2.0 * feature_values(ids, (4,)).sum(axis=1), atol=1e-5)


def test_a_queue_full_for_longer_than_the_retry_time_is_a_server_failure(
    throttled_server: ServerProcess,
) -> None:
    job = job_for(throttled_server, max_retry_time_s=0.05)
    with pytest.raises(
        ServerUnavailable, match=r"kept answering RESOURCE_EXHAUSTED for [\d.]+ s \(max_retry_time_s=0.05\)"
    ):
        list(
            predict_partition(
                job, iter(requests(np.arange(6_000), 1_000)), {}, TaskPlacement(), breakers=CircuitBreakers()
            )
        )


def test_a_server_that_holds_requests_until_its_queue_has_room_answers_every_batch_at_its_first_send(
    holding_server: ServerProcess,
) -> None:
    ids = np.arange(6_000)
    refused_before, held_before = refused_requests(holding_server), room_waits(holding_server)
    job = job_for(holding_server)
    stats = ClientStats()
    answers = list(
        predict_partition(
            job, iter(requests(ids, 1_000)), {}, TaskPlacement(), stats=stats, breakers=CircuitBreakers()
        )
    )
    assert refused_requests(holding_server) == refused_before
    assert room_waits(holding_server) > held_before
    assert (stats.sends, stats.retries, stats.backoff_waits, stats.backoff_s) == (6, 0, 0, 0.0)
    assert (stats.rows_by_server, stats.server_failures) == (6_000, {})
    predicted = np.concatenate([a.column(0).to_numpy() for a in answers])
    np.testing.assert_allclose(predicted, 2.0 * feature_values(ids, (4,)).sum(axis=1), atol=1e-5)
