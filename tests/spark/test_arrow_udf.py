"""remote_predict(..., udf_type="arrow"): the same column API as the pandas UDF, through PySpark's
Arrow UDFs, against a real model server in local mode."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, remote_predict

MODELS = {
    # model: (input column, per-row input shape, output name)
    "tabular_mlp": ("features", (64,), "probabilities"),
    "sequence_bilstm": ("lines", (16, 32), "class_probabilities"),
}


def inputs_frame(spark: SparkSession, model: str, rows: int) -> DataFrame:
    column, shape, _ = MODELS[model]
    return spark.range(rows, numPartitions=2).withColumn(column, feature_column(shape))


def multi_io_frame(spark: SparkSession, rows: int) -> DataFrame:
    return (
        spark.range(rows, numPartitions=2)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", (F.col("id") % 16).cast("int"))
    )


@pytest.mark.parametrize("model", sorted(MODELS))
def test_an_arrow_udf_predicts_what_the_model_run_in_process_does(
    spark: SparkSession, server: ServerProcess, example_repository: Path, model: str
) -> None:
    column, shape, output = MODELS[model]
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    udf = remote_predict(model, udf_type="arrow", config=config)
    result = inputs_frame(spark, model, 20_000).select("id", udf(column).alias("p")).toPandas()
    result = result.sort_values("id")
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(20_000))
    reference = reference_outputs(example_repository, model, {column: feature_values(ids, shape)})[output]
    np.testing.assert_allclose(stacked(result["p"]), reference, atol=1e-5)
    assert udf.stats().rows_by_server == 20_000


def test_an_arrow_udf_declares_the_return_type_the_pandas_udf_does(
    spark: SparkSession, server: ServerProcess
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    frame = multi_io_frame(spark, 10).select(
        remote_predict("multi_io", "numeric", "category", config=config).alias("pandas"),
        remote_predict("multi_io", "numeric", "category", udf_type="arrow", config=config).alias("arrow"),
    )
    assert frame.schema["arrow"].dataType == frame.schema["pandas"].dataType
    assert isinstance(frame.schema["arrow"].dataType, T.StructType)


def test_an_arrow_udf_answers_several_outputs_as_the_pandas_udf_does(
    spark: SparkSession, server: ServerProcess
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    result = (
        multi_io_frame(spark, 3_000)
        .select(
            "id",
            remote_predict("multi_io", "numeric", "category", config=config).alias("pandas"),
            remote_predict("multi_io", "numeric", "category", udf_type="arrow", config=config).alias("arrow"),
        )
        .select(
            "id",
            "pandas.score",
            "pandas.embedding",
            F.col("arrow.score").alias("arrow_score"),
            F.col("arrow.embedding").alias("arrow_embedding"),
        )
        .toPandas()
    )
    np.testing.assert_array_equal(result["arrow_score"].to_numpy(), result["score"].to_numpy())
    np.testing.assert_array_equal(stacked(result["arrow_embedding"]), stacked(result["embedding"]))


def test_an_arrow_udf_fails_a_batch_the_server_refuses_naming_the_expected_length(
    spark: SparkSession, server: ServerProcess
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*column 'features'.*length 64, received length 8"):
        spark.range(100, numPartitions=1).select(
            remote_predict("tabular_mlp", feature_column((8,)), udf_type="arrow", config=config)
        ).collect()


def test_an_arrow_udf_refuses_a_null_number_naming_its_row(
    spark: SparkSession, server: ServerProcess
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    frame = multi_io_frame(spark, 100).withColumn(
        "category", F.when(F.col("id") == 7, F.lit(None)).otherwise(F.col("category"))
    )
    udf = remote_predict("multi_io", udf_type="arrow", config=config)
    with pytest.raises(
        Exception, match=r"INVALID_ARGUMENT.*'category'.*expected no nulls, received a null row 7"
    ):
        frame.coalesce(1).select(udf("numeric", "category")).collect()


def test_an_arrow_udf_answers_requests_that_straddle_spark_batches_row_for_row(
    spark: SparkSession, server: ServerProcess, example_repository: Path
) -> None:
    """15,000 rows per partition arrive as Spark batches of 10,000 and 5,000; requests of 3,000
    rows cut across them, so each batch's answer is joined from slices of several answers."""
    config = ClientConfig(address=server.grpc_target(), fallback="error", rows_per_request=3_000)
    udf = remote_predict("multi_io", udf_type="arrow", config=config)
    result = (
        multi_io_frame(spark, 30_000)
        .select("id", udf("numeric", "category").alias("p"))
        .select("id", "p.score", "p.embedding")
        .toPandas()
        .sort_values("id")
    )
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(30_000))
    inputs = {"numeric": feature_values(ids, (8,)), "category": (ids % 16).astype(np.int32)}
    reference = reference_outputs(example_repository, "multi_io", inputs)
    np.testing.assert_allclose(result["score"].to_numpy(), reference["score"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(stacked(result["embedding"]), reference["embedding"], atol=1e-5)


def test_the_arrow_udf_called_with_the_inputs_in_order_answers_as_with_a_struct(
    spark: SparkSession, server: ServerProcess
) -> None:
    udf = remote_predict(
        "multi_io", udf_type="arrow", config=ClientConfig(address=server.grpc_target(), fallback="error")
    )
    assert udf.job.spec.input_names == ("category", "numeric")  # the order the model lists them
    result = (
        multi_io_frame(spark, 2_000)
        .select(
            udf.spark_udf(F.col("category"), F.col("numeric")).alias("in_order"),
            udf("numeric", "category").alias("struct"),
        )
        .toPandas()
    )
    in_order = np.array([row["score"] for row in result["in_order"]])
    as_struct = np.array([row["score"] for row in result["struct"]])
    np.testing.assert_array_equal(in_order, as_struct)


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_a_struct_return_type_naming_no_output_is_refused_in_the_driver_naming_the_outputs(
    spark: SparkSession, server: ServerProcess, udf_type: Literal["pandas", "arrow"]
) -> None:
    """An Arrow UDF would answer null in every row of a field named after no output."""
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    with pytest.raises(ValueError, match=r"field\(s\) \['a'\] are not outputs .* \['score', 'embedding'\]"):
        remote_predict(
            "multi_io",
            return_type="struct<a: float, embedding: array<float>>",
            udf_type=udf_type,
            config=config,
        )


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_a_return_type_that_would_change_the_answers_is_refused_in_the_driver(
    spark: SparkSession, server: ServerProcess, udf_type: Literal["pandas", "arrow"]
) -> None:
    """Unchecked, a pandas UDF declared array<int> answers 0 for every probability."""
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    with pytest.raises(
        ValueError, match=r"model 'tabular_mlp': the return type is array<int>.*expected array<float>"
    ):
        remote_predict("tabular_mlp", return_type="array<int>", udf_type=udf_type, config=config)


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_a_struct_return_type_of_some_outputs_in_another_order_is_filled_by_name(
    spark: SparkSession, server: ServerProcess, udf_type: Literal["pandas", "arrow"]
) -> None:
    """ "score float" is a struct in Spark's DDL, as "struct<score: float>" is."""
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    full = remote_predict("multi_io", udf_type=udf_type, config=config)
    reordered = remote_predict(
        "multi_io",
        return_type="struct<embedding: array<float>, score: float>",
        udf_type=udf_type,
        config=config,
    )
    some = remote_predict("multi_io", return_type="score float", udf_type=udf_type, config=config)
    # not the first output: a pandas UDF's struct is taken by position before its names are checked
    later = remote_predict("multi_io", return_type="embedding array<float>", udf_type=udf_type, config=config)
    result = (
        multi_io_frame(spark, 1_000)
        .select(
            full("numeric", "category").alias("full"),
            reordered("numeric", "category").alias("reordered"),
            some("numeric", "category").alias("some"),
            later("numeric", "category").alias("later"),
        )
        .select(
            "full.score",
            "full.embedding",
            F.col("reordered.score").alias("r_score"),
            F.col("reordered.embedding").alias("r_embedding"),
            F.col("some.score").alias("s_score"),
            F.col("later.embedding").alias("l_embedding"),
        )
        .toPandas()
    )
    np.testing.assert_array_equal(stacked(result["l_embedding"]), stacked(result["embedding"]))
    np.testing.assert_array_equal(result["r_score"].to_numpy(), result["score"].to_numpy())
    np.testing.assert_array_equal(stacked(result["r_embedding"]), stacked(result["embedding"]))
    np.testing.assert_array_equal(result["s_score"].to_numpy(), result["score"].to_numpy())


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_several_columns_for_a_single_input_model_are_refused_in_the_driver(
    spark: SparkSession, server: ServerProcess, udf_type: Literal["pandas", "arrow"]
) -> None:
    udf = remote_predict(
        "tabular_mlp", udf_type=udf_type, config=ClientConfig(address=server.grpc_target(), fallback="error")
    )
    with pytest.raises(ValueError, match=r"one input 'features'; expected one column, received 2"):
        udf("features", "id")


def test_an_unknown_udf_type_is_refused_naming_the_kinds_remote_predict_makes() -> None:
    with pytest.raises(ValueError, match=r"udf_type 'numpy' .* expected one of \('pandas', 'arrow'\)"):
        remote_predict("tabular_mlp", udf_type="numpy")  # type: ignore[arg-type]


def test_an_arrow_udf_on_a_pyspark_without_arrow_udfs_is_refused_naming_the_version_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySpark 4.0 has no ``arrow_udf``; the driver says so before it asks any server anything."""
    import pyspark.sql.functions

    monkeypatch.delattr(pyspark.sql.functions, "arrow_udf")
    with pytest.raises(
        ValueError, match=r"udf_type='arrow' needs PySpark 4\.1 or later .* use udf_type='pandas'"
    ):
        remote_predict("tabular_mlp", udf_type="arrow")
