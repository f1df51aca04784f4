"""The Predict stream against a real server whose queue is kept full: back-off, not failure.

No Spark here: the partition runner is driven directly with Arrow batches, so the test can
count the resends. The server's one model queues at most one request of 1,000 rows and waits
0.2 s for a batch to fill that never fills, so every other request of the window is answered
RESOURCE_EXHAUSTED while the first one waits.
"""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from spark_data import feature_values, reference_outputs

from services.model_server.launcher import ServerProcess, launch_server
from spark_client.circuit import CircuitBreakers
from spark_client.config import ClientConfig
from spark_client.errors import ServerUnavailable
from spark_client.partition import PredictJob, predict_partition
from spark_client.routing import TaskPlacement
from spark_client.stats import ClientStats
from spark_client.transport import connect

THROTTLED_CONFIG = """\
name: tabular_mlp
max_batch_size: 4096
dynamic_batching:
  max_queue_delay_s: 0.2
  max_queue_rows: 1000
"""


@pytest.fixture(scope="module")
def throttled_server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("throttled")
    shutil.copytree(example_repository / "tabular_mlp", root / "repository" / "tabular_mlp")
    (root / "repository" / "tabular_mlp" / "config.yaml").write_text(THROTTLED_CONFIG)
    process = launch_server(
        root / "repository", socket=root / "grpc.sock", port=None, http_port=0, log_path=root / "server.log"
    )
    yield process
    process.terminate()


def requests(ids: np.ndarray, rows_per_request: int) -> list[pa.RecordBatch]:
    values = feature_values(ids, (64,))
    column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 64)
    batch = pa.RecordBatch.from_arrays([column], names=["features"])
    return [batch.slice(start, rows_per_request) for start in range(0, len(ids), rows_per_request)]


def job_for(server: ServerProcess, **settings: object) -> PredictJob:
    config = ClientConfig.model_validate(
        {"address": server.grpc_target(), "max_in_flight": 6, "fallback": "error", **settings}
    )
    _, spec = connect(server.grpc_target(), config, "tabular_mlp")
    return PredictJob("tabular_mlp", spec, config)


def refused_requests(server: ServerProcess) -> float:
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("udfserve_requests_total{") and 'code="RESOURCE_EXHAUSTED"' in line
    )


def test_a_full_queue_is_waited_out_and_every_batch_answered_in_order(
    throttled_server: ServerProcess, example_repository: Path
) -> None:
    """The fallback is allowed here (the CPU could answer): the client waits instead."""
    ids = np.arange(6_000)
    refused_before = refused_requests(throttled_server)
    job = job_for(throttled_server, fallback="cpu", model_repository=str(example_repository))
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
    predicted = np.concatenate([a.column(0).flatten().to_numpy().reshape(-1, 8) for a in answers])
    expected = reference_outputs(example_repository, "tabular_mlp", {"features": feature_values(ids, (64,))})
    np.testing.assert_allclose(predicted, expected["probabilities"], atol=1e-5)


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
