"""Spark jobs against a repository holding only ``scored/1/model.onnx`` (a graph the examples never
use, no config.yaml): remote_predict's answers equal ONNX Runtime's own in this process, and a
server killed mid-job leaves every row answered exactly once, the rest by the CPU fallback, which
runs the same ONNX Runtime backend in the Python workers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx_graphs import SCORED_TABLE_ROWS, scored_graph, write_model
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import ROWS, feature_column, feature_values, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict

MODEL = "scored"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def onnx_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx_only")
    write_model(root, MODEL, scored_graph())
    return root


def start_server(repository: Path, folder: Path) -> ServerProcess:
    return launch_server(
        repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )


@pytest.fixture(scope="module")
def onnx_server(onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(onnx_repository, tmp_path_factory.mktemp("onnx_server"))
    yield process
    process.terminate()


@pytest.fixture
def own_onnx_server(onnx_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test kills."""
    process = start_server(onnx_repository, tmp_path)
    yield process
    process.kill()


def input_columns() -> tuple[Column, Column]:
    """``amount`` (3 floats of the row's id) and ``code`` (the id modulo the table's rows)."""
    return feature_column((3,)), (F.col("id") % SCORED_TABLE_ROWS).cast("long")  # type: ignore[return-value]


def onnxruntime_answers(repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime's own answers for the rows ``ids``, computed in this process."""
    session = ort.InferenceSession(
        str(repository / MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = {"amount": feature_values(ids, (3,)), "code": (ids % SCORED_TABLE_ROWS).astype(np.int64)}
    return dict(zip(["score", "scaled"], session.run(["score", "scaled"], inputs), strict=True))


def predicted(spark: SparkSession, rows: int, config: ClientConfig) -> tuple[object, DataFrame]:
    predict = remote_predict(MODEL, config=config)
    frame = spark.range(rows, numPartitions=2).select("id", predict(*input_columns()).alias("p"))
    return predict, frame.select("id", "p.score", "p.scaled")


def assert_onnxruntimes_answers(result: object, repository: Path, rows: int) -> None:
    ids = result["id"].to_numpy()  # type: ignore[index]
    assert len(ids) == rows and len(np.unique(ids)) == rows, "a row was lost or answered twice"
    ordered = result.sort_values("id")  # type: ignore[attr-defined]
    expected = onnxruntime_answers(repository, ordered["id"].to_numpy())
    np.testing.assert_allclose(ordered["score"].to_numpy(), expected["score"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(stacked(ordered["scaled"]), expected["scaled"], atol=TOLERANCE, rtol=0)


@pytest.mark.slow
def test_a_spark_jobs_predictions_equal_onnxruntimes_own(
    spark: SparkSession, onnx_server: ServerProcess, onnx_repository: Path
) -> None:
    """The fallback is off: every row is the server's answer."""
    predict, frame = predicted(spark, ROWS, ClientConfig(address=onnx_server.grpc_target(), fallback="error"))

    result = frame.toPandas()

    assert_onnxruntimes_answers(result, onnx_repository, ROWS)
    assert predict.stats().rows_by_server == ROWS  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_server_killed_mid_job_answers_every_row_exactly_once_through_the_fallback(
    spark: SparkSession, own_onnx_server: ServerProcess, onnx_repository: Path, spark_log: Path
) -> None:
    """A step after the prediction kills the server with SIGKILL when it sees row ``kill_at``,
    recording how many rows the server had answered by then: fewer than the job's rows, so the
    rest can only have come from the CPU fallback."""
    kill_at, pid, metrics_url = 5_000, own_onnx_server.pid, f"http://{own_onnx_server.http_address}/metrics"

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
        address=own_onnx_server.grpc_target(), model_repository=str(onnx_repository), rows_per_request=2_000
    )
    predict, frame = predicted(spark, ROWS, config)
    schema = T.StructType([*frame.schema.fields, T.StructField("served_before_kill", T.DoubleType())])

    result = frame.mapInArrow(kill_server_at_row, schema).toPandas()

    assert own_onnx_server.process.wait(timeout=30) == -9
    served_before_kill = result["served_before_kill"].dropna().tolist()
    assert len(served_before_kill) == 1 and 0 < served_before_kill[0] < ROWS
    assert_onnxruntimes_answers(result, onnx_repository, ROWS)
    assert re.search(
        r"the server failed mid-partition after \d+ answered batches", spark_log.read_text(errors="replace")
    )
    stats = predict.stats()  # type: ignore[attr-defined]
    assert stats.rows_by_server + stats.rows_by_fallback == ROWS
    assert stats.rows_by_server > 0 and stats.rows_by_fallback > 0
