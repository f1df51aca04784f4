"""Spark jobs against a repository holding only ``scored/1/model.onnx`` (a graph the examples never
use, no config.yaml): remote_predict's answers equal ONNX Runtime's own in this process. (The same
job with the server SIGKILLed mid-way is one case of ``test_server_killed_mid_job.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx_graphs import SCORED_TABLE_ROWS, scored_graph, write_model
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
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
