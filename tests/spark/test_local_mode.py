"""remote_predict and predict_arrow against a real model server, in local mode: same numbers as the model."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import ROWS, feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict

MODELS = {
    # model: (input column, per-row input shape, output name, per-row output width)
    "tabular_mlp": ("features", (64,), "probabilities", 8),
    "sequence_bilstm": ("lines", (16, 32), "class_probabilities", 4),
}


def inputs_frame(spark: SparkSession, model: str, rows: int) -> DataFrame:
    column, shape, _, _ = MODELS[model]
    return spark.range(rows, numPartitions=2).withColumn(column, feature_column(shape))


def expected(example_repository: Path, model: str, ids: np.ndarray) -> np.ndarray:
    column, shape, output, _ = MODELS[model]
    return reference_outputs(example_repository, model, {column: feature_values(ids, shape)})[output]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_remote_predict_equals_the_model_run_in_process(
    spark: SparkSession, server: ServerProcess, example_repository: Path, model: str
) -> None:
    column, _, _, _ = MODELS[model]
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    result = (
        inputs_frame(spark, model, ROWS)
        .select("id", remote_predict(model, column, config=config).alias("prediction"))
        .toPandas()
        .sort_values("id")
    )
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(ROWS))
    np.testing.assert_allclose(
        stacked(result["prediction"]), expected(example_repository, model, ids), atol=1e-5
    )


@pytest.mark.parametrize("model", sorted(MODELS))
def test_predict_arrow_appends_outputs_equal_to_the_model_run_in_process(
    spark: SparkSession, server: ServerProcess, example_repository: Path, model: str
) -> None:
    column, _, output, _ = MODELS[model]
    frame = predict_arrow(
        inputs_frame(spark, model, ROWS),
        model,
        config=ClientConfig(address=server.grpc_target(), fallback="error"),
    )
    assert frame.columns == ["id", column, output]
    result = frame.select("id", output).toPandas().sort_values("id")
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(ROWS))
    np.testing.assert_allclose(stacked(result[output]), expected(example_repository, model, ids), atol=1e-5)


def multi_io_frame(spark: SparkSession, rows: int) -> DataFrame:
    return (
        spark.range(rows, numPartitions=2)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", (F.col("id") % 16).cast("int"))
    )


def multi_io_expected(example_repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    inputs = {"numeric": feature_values(ids, (8,)), "category": (ids % 16).astype(np.int32)}
    return reference_outputs(example_repository, "multi_io", inputs)


def test_return_type_follows_the_model_outputs(spark: SparkSession, server: ServerProcess) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    frame = multi_io_frame(spark, 10).select(
        remote_predict("tabular_mlp", feature_column((64,)), config=config).alias("vector"),
        remote_predict("multi_io", "numeric", "category", config=config).alias("several"),
    )
    assert frame.schema["vector"].dataType == T.ArrayType(T.FloatType(), containsNull=False)
    assert frame.schema["several"].dataType == T.StructType(
        [
            T.StructField("score", T.FloatType()),
            T.StructField("embedding", T.ArrayType(T.FloatType(), containsNull=False)),
        ]
    )


def test_several_outputs_arrive_as_a_struct_equal_to_the_model(
    spark: SparkSession, server: ServerProcess, example_repository: Path
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    result = (
        multi_io_frame(spark, 5_000)
        .select("id", remote_predict("multi_io", "numeric", "category", config=config).alias("p"))
        .select("id", "p.score", "p.embedding")
        .toPandas()
        .sort_values("id")
    )
    reference = multi_io_expected(example_repository, result["id"].to_numpy())
    np.testing.assert_allclose(result["score"].to_numpy(), reference["score"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(stacked(result["embedding"]), reference["embedding"], atol=1e-5)


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_a_struct_column_feeds_the_inputs_by_field_name(
    spark: SparkSession, server: ServerProcess, udf_type: Literal["pandas", "arrow"]
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    udf = remote_predict("multi_io", udf_type=udf_type, config=config)
    result = (
        multi_io_frame(spark, 2_000)
        .select(
            udf("numeric", "category").alias("positional"),
            udf(F.struct(F.col("category"), F.col("numeric"))).alias("by_name"),
        )
        .toPandas()
    )
    positional = np.array([row["score"] for row in result["positional"]])
    by_name = np.array([row["score"] for row in result["by_name"]])
    np.testing.assert_array_equal(positional, by_name)


def test_predict_arrow_names_outputs_and_takes_a_struct_input(
    spark: SparkSession, server: ServerProcess, example_repository: Path
) -> None:
    frame = multi_io_frame(spark, 3_000).withColumn("x", F.struct("numeric", "category"))
    result = predict_arrow(
        frame.select("id", "x"),
        "multi_io",
        input_columns=["x"],
        output_columns=["s", "e"],
        config=ClientConfig(address=server.grpc_target(), fallback="error"),
    )
    assert result.columns == ["id", "x", "s", "e"]
    pdf = result.select("id", "s", "e").toPandas().sort_values("id")
    reference = multi_io_expected(example_repository, pdf["id"].to_numpy())
    np.testing.assert_allclose(pdf["s"].to_numpy(), reference["score"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(stacked(pdf["e"]), reference["embedding"], atol=1e-5)


@pytest.mark.parametrize(
    ("outputs", "refusal"),
    [
        (["ID", "e"], r"output column\(s\) \['ID'\] already exist in the DataFrame .*without case"),
        (["p", "p"], r"output column\(s\) \['p'\] are named twice"),
        (["p", "P"], r"output column\(s\) \['P', 'p'\] are named twice"),
    ],
)
def test_predict_arrow_refuses_output_names_spark_could_not_tell_apart(
    spark: SparkSession, server: ServerProcess, outputs: list[str], refusal: str
) -> None:
    frame = multi_io_frame(spark, 10)
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    with pytest.raises(ValueError, match=refusal):
        predict_arrow(frame, "multi_io", output_columns=outputs, config=config)


def test_the_server_is_found_through_the_discovery_file(
    spark: SparkSession, server: ServerProcess, example_repository: Path, tmp_path: Path
) -> None:
    from udfserve.discovery import NodeDiscovery, ServerEntry, write_discovery

    discovery_file = tmp_path / "discovery.json"
    entry = ServerEntry(device="cpu", unix_socket=server.unix_socket, tcp_address=server.tcp_address)
    write_discovery(discovery_file, NodeDiscovery(model_repository=str(example_repository), servers=[entry]))
    config = ClientConfig(discovery_file=str(discovery_file), fallback="error")
    result = (
        inputs_frame(spark, "tabular_mlp", 5_000)
        .select("id", remote_predict("tabular_mlp", "features", config=config).alias("p"))
        .toPandas()
        .sort_values("id")
    )
    np.testing.assert_allclose(
        stacked(result["p"]), expected(example_repository, "tabular_mlp", result["id"].to_numpy()), atol=1e-5
    )


def test_wide_rows_are_sent_in_requests_of_about_bytes_per_request(
    spark: SparkSession, server: ServerProcess
) -> None:
    """2 KiB per row of the sequence model: 2 MiB requests are 1,024 rows; the tabular model's
    256-byte rows keep rows_per_request."""
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    assert remote_predict("sequence_bilstm", config=config).job.config.rows_per_request == 1024
    assert remote_predict("tabular_mlp", config=config).job.config.rows_per_request == 4096
    wider = ClientConfig(address=server.grpc_target(), fallback="error", bytes_per_request=16 << 20)
    assert remote_predict("sequence_bilstm", config=wider).job.config.rows_per_request == 4096


def test_rows_cut_by_bytes_per_request_are_each_answered_once_as_the_model_does(
    spark: SparkSession, server: ServerProcess, example_repository: Path
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error", bytes_per_request=64 << 10)
    udf = remote_predict("sequence_bilstm", config=config)
    assert udf.job.config.rows_per_request == 32
    result = inputs_frame(spark, "sequence_bilstm", 1_000).select("id", udf("lines").alias("p")).toPandas()
    result = result.sort_values("id")
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(1_000))
    np.testing.assert_allclose(
        stacked(result["p"]), expected(example_repository, "sequence_bilstm", ids), atol=1e-5
    )
    assert udf.stats().batches_by_server == 2 * 16  # two partitions of 500 rows: 15 x 32 rows + 20
