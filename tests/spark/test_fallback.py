"""When no server answers: the CPU fallback, the "error" policy, and a server killed mid-job."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import ROWS, feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict


@pytest.fixture
def own_server(example_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test may stop or kill."""
    process = launch_server(
        example_repository,
        socket=tmp_path / "grpc.sock",
        port=0,
        http_port=0,
        log_path=tmp_path / "server.log",
    )
    yield process
    process.kill()


def tabular_expected(example_repository: Path, ids: np.ndarray) -> np.ndarray:
    inputs = {"features": feature_values(ids, (64,))}
    return reference_outputs(example_repository, "tabular_mlp", inputs)["probabilities"]


def test_with_no_server_the_rows_are_predicted_on_the_cpu_with_a_warning(
    spark: SparkSession, example_repository: Path, spark_log: Path, tmp_path: Path
) -> None:
    absent = f"unix://{tmp_path / 'no-server.sock'}"
    config = ClientConfig(address=absent, model_repository=str(example_repository))
    frame = spark.range(20_000, numPartitions=2).withColumn("features", feature_column((64,)))
    result = predict_arrow(frame, "tabular_mlp", config=config).select("id", "probabilities").toPandas()
    result = result.sort_values("id")
    assert np.array_equal(result["id"].to_numpy(), np.arange(20_000))
    np.testing.assert_allclose(
        stacked(result["probabilities"]),
        tabular_expected(example_repository, result["id"].to_numpy()),
        atol=1e-5,
    )
    warnings = [
        line
        for line in spark_log.read_text(errors="replace").splitlines()
        if "on the CPU in this Python worker" in line and absent in line
    ]
    assert len(warnings) == 2, f"expected one warning per partition naming {absent}, found {warnings}"
    assert "socket file" in warnings[0] and "does not exist" in warnings[0]


def test_fallback_error_fails_the_task_naming_the_addresses_tried(
    spark: SparkSession, own_server: ServerProcess
) -> None:
    target = own_server.grpc_target()
    column = remote_predict(
        "tabular_mlp", feature_column((64,)), config=ClientConfig(address=target, fallback="error")
    )  # built while the server runs: the driver reads the model's outputs from it
    own_server.terminate()
    with pytest.raises(Exception, match="fallback='error'") as failure:
        spark.range(1_000, numPartitions=1).select(column).collect()
    assert f"addresses tried: {target}" in str(failure.value)


def test_a_batch_the_server_refuses_fails_the_task_instead_of_falling_back(
    spark: SparkSession, own_server: ServerProcess, example_repository: Path
) -> None:
    config = ClientConfig(address=own_server.grpc_target(), model_repository=str(example_repository))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*column 'features'.*length 64, received length 8"):
        spark.range(100, numPartitions=1).select(
            remote_predict("tabular_mlp", feature_column((8,)), config=config)
        ).collect()


def test_a_server_killed_mid_job_loses_and_duplicates_no_row(
    spark: SparkSession, own_server: ServerProcess, example_repository: Path, spark_log: Path
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
        address=own_server.grpc_target(), model_repository=str(example_repository), rows_per_request=2_000
    )
    predict = remote_predict("tabular_mlp", config=config)
    predicted = spark.range(ROWS, numPartitions=2).select("id", predict(feature_column((64,))).alias("p"))
    schema = T.StructType([*predicted.schema.fields, T.StructField("served_before_kill", T.DoubleType())])
    result = predicted.mapInArrow(kill_server_at_row, schema).toPandas()

    assert own_server.process.wait(timeout=30) == -9
    served_before_kill = result["served_before_kill"].dropna().tolist()
    assert len(served_before_kill) == 1 and 0 < served_before_kill[0] < ROWS
    ids = result["id"].to_numpy()
    assert len(ids) == ROWS and len(np.unique(ids)) == ROWS
    result = result.sort_values("id")
    np.testing.assert_allclose(
        stacked(result["p"]), tabular_expected(example_repository, result["id"].to_numpy()), atol=1e-5
    )
    log = spark_log.read_text(errors="replace")
    assert re.search(r"the server failed mid-partition after \d+ answered batches", log)
    stats = predict.stats()
    assert stats.rows_by_server + stats.rows_by_fallback == ROWS
    assert stats.rows_by_server > 0 and stats.rows_by_fallback > 0
    assert stats.batches_by_fallback == sum(stats.fallback_reasons.values()) > 0
    assert set(stats.fallback_reasons) <= {
        "stream_error:UNAVAILABLE",
        "stream_error:CANCELLED",
        "stream_closed",
        "connect_failed",
    }, stats.fallback_reasons


def test_fallback_results_carry_the_model_outputs_of_every_type(
    spark: SparkSession, example_repository: Path, tmp_path: Path
) -> None:
    config = ClientConfig(
        address=f"unix://{tmp_path / 'none.sock'}", model_repository=str(example_repository)
    )
    frame = (
        spark.range(1_000, numPartitions=1)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", (F.col("id") % 16).cast("int"))
    )
    result = frame.select("id", remote_predict("multi_io", "numeric", "category", config=config).alias("p"))
    pdf = result.select("id", "p.score", "p.embedding").toPandas().sort_values("id")
    ids = pdf["id"].to_numpy()
    reference = reference_outputs(
        example_repository,
        "multi_io",
        {"numeric": feature_values(ids, (8,)), "category": (ids % 16).astype(np.int32)},
    )
    np.testing.assert_allclose(pdf["score"].to_numpy(), reference["score"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(stacked(pdf["embedding"]), reference["embedding"], atol=1e-5)


def test_a_batch_the_cpu_fallback_refuses_names_the_row_the_server_would(
    spark: SparkSession, example_repository: Path, tmp_path: Path
) -> None:
    """One request of 1,000 rows, more than multi_io's max_batch_size (512): the row is counted
    from the request's start, not from the start of the chunk the model ran on."""
    config = ClientConfig(
        address=f"unix://{tmp_path / 'none.sock'}", model_repository=str(example_repository)
    )
    frame = (
        spark.range(1_000, numPartitions=1)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", F.when(F.col("id") == 700, None).otherwise(F.col("id") % 16).cast("int"))
    )
    with pytest.raises(Exception, match=r"CPU fallback refused a batch of 1000 rows: .*null row 700\b"):
        predict_arrow(frame, "multi_io", ["numeric", "category"], config=config).collect()
