"""Spark jobs on a PyTorch model served from a repository holding only ``m/1/model.pt2`` (a
two-input conv net no example uses, no config.yaml): the predictions equal torch's own in this
process, and a server killed mid-job leaves every row answered exactly once, the rest by the CPU
fallback, which loads the same file with the same backend in the Python workers."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
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


@pytest.fixture
def own_server(torch_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test kills."""
    process = launch_server(
        torch_repository, socket=tmp_path / "grpc.sock", port=0, http_port=0, log_path=tmp_path / "server.log"
    )
    yield process
    process.kill()


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


def test_a_server_killed_mid_job_answers_every_row_once_through_the_torch_fallback(
    spark: SparkSession, own_server: ServerProcess, torch_repository: Path, spark_log: Path
) -> None:
    """A step after the prediction kills the server with SIGKILL when it sees row ``kill_at``,
    recording how many rows the server had answered by then: fewer than the job's rows, so the
    rest can only have come from the CPU fallback."""
    kill_at, pid, metrics_url = 5_000, own_server.pid, f"http://{own_server.http_address}/metrics"

    def kill_server_at_row(batches: Iterator[object]) -> Iterator[object]:
        import os
        import signal
        import urllib.request

        import pyarrow as pa

        for batch in batches:
            served = [None] * batch.num_rows  # type: ignore[attr-defined]
            ids = batch.column("id").to_pylist()  # type: ignore[attr-defined]
            if kill_at in ids:
                text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
                served[ids.index(kill_at)] = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("udfserve_rows_total{")
                )
                os.kill(pid, signal.SIGKILL)
            yield batch.append_column("served_before_kill", pa.array(served, pa.float64()))  # type: ignore[attr-defined]

    config = ClientConfig(
        address=own_server.grpc_target(), model_repository=str(torch_repository), rows_per_request=2_000
    )
    predict = remote_predict("m", config=config)
    predicted = image_and_offset(spark, ROWS).select("id", predict("image", "offset").alias("p"))
    schema = T.StructType([*predicted.schema.fields, T.StructField("served_before_kill", T.DoubleType())])
    result = (
        predicted.mapInArrow(kill_server_at_row, schema)
        .select("id", "p.probabilities", "p.energy", "served_before_kill")
        .toPandas()
    )

    assert own_server.process.wait(timeout=30) == -9
    served_before_kill = result["served_before_kill"].dropna().tolist()
    assert len(served_before_kill) == 1 and 0 < served_before_kill[0] < ROWS
    check_equal_to_torch(result, torch_repository, ROWS)
    assert re.search(
        r"the server failed mid-partition after \d+ answered batches", spark_log.read_text(errors="replace")
    )
    stats = predict.stats()
    assert stats.rows_by_server + stats.rows_by_fallback == ROWS
    assert stats.rows_by_server > 0 and stats.rows_by_fallback > 0
