"""Spark jobs on a PyTorch model served from a repository holding only ``m/1/model.pt2`` (a
two-input conv net no example uses, no config.yaml): the predictions equal torch's own in this
process. (The same job with the server SIGKILLed mid-way is one case of
``test_server_killed_mid_job.py``.)"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from spark_data import ROWS, feature_column, stacked
from torch_programs import IMAGE_SHAPE, conv_net_inputs, conv_net_repository, torch_outputs

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return conv_net_repository(tmp_path_factory.mktemp("torch-repo"))


@pytest.fixture(scope="module")
def torch_server(torch_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("torch-server")
    process = launch_server(
        torch_repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )
    yield process
    process.terminate()


def image_and_offset(spark: SparkSession, rows: int) -> DataFrame:
    return spark.range(rows, numPartitions=2).select(
        "id", feature_column(IMAGE_SHAPE).alias("image"), (F.col("id") % 5).alias("offset")
    )


def check_equal_to_torch(result: object, repository: Path, rows: int) -> None:
    ids = result["id"].to_numpy()  # type: ignore[index]
    assert len(ids) == rows and len(np.unique(ids)) == rows, "a row was lost or answered twice"
    ordered = result.sort_values("id")  # type: ignore[attr-defined]
    expected = torch_outputs(repository / "m" / "1" / "model.pt2", conv_net_inputs(ordered["id"].to_numpy()))
    np.testing.assert_allclose(stacked(ordered["probabilities"]), expected["probabilities"], atol=TOLERANCE)
    np.testing.assert_allclose(ordered["energy"].to_numpy(), expected["energy"], atol=TOLERANCE)


def counter(http_address: str, name: str) -> float:
    """The sum of a counter's samples on the server's /metrics page."""
    text = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def test_a_spark_jobs_predictions_equal_torchs_in_process(
    spark: SparkSession, torch_server: ServerProcess, torch_repository: Path
) -> None:
    """Through the unix socket, payloads in shared memory (the client's default on a node's server),
    counted by the server's metrics like any model's."""
    rows_before = counter(torch_server.http_address, "udfserve_rows_total")
    shared_before = counter(torch_server.http_address, "udfserve_shared_memory_requests_total")
    config = ClientConfig(address=torch_server.grpc_target(), fallback="error")
    predicted = image_and_offset(spark, ROWS).select(
        "id", remote_predict("m", "image", "offset", config=config).alias("p")
    )
    result = predicted.select("id", "p.probabilities", "p.energy").toPandas()
    check_equal_to_torch(result, torch_repository, ROWS)
    assert counter(torch_server.http_address, "udfserve_rows_total") - rows_before == ROWS
    assert counter(torch_server.http_address, "udfserve_shared_memory_requests_total") > shared_before
