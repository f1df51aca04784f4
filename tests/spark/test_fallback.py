"""When no server answers: the CPU fallback and the "error" policy. (A server killed mid-job:
``test_server_killed_mid_job.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict


@pytest.fixture
def own_server(tabular_onnx_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test may stop or kill: the tabular model's ONNX graph, as
    what is tested is the client's policy and the server's refusal, not TensorFlow (a start
    without its import). The CPU fallback tests below run TensorFlow in the Python workers."""
    process = launch_server(
        tabular_onnx_repository,
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
