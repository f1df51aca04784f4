"""A Spark string column feeds a model's string input (``text_hashing``): the server over both
protocols and the CPU fallback each answer what the Keras model computes for the UTF-8 bytes,
through either kind of UDF ``remote_predict`` makes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from spark_data import reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, remote_predict

ROWS = 5_000


def text_column() -> object:
    """A text per row computed from its id, beyond ASCII on purpose."""
    return F.concat(F.lit("texte n°"), ((F.col("id") * 7919) % 1000).cast("string"))


def text_values(ids: np.ndarray) -> np.ndarray:
    """The same texts as ``text_column``, as the bytes the model receives."""
    return np.array([f"texte n°{(int(i) * 7919) % 1000}".encode() for i in ids], dtype=object)


UdfType = Literal["pandas", "arrow"]


def predicted_texts(
    spark: SparkSession, config: ClientConfig, udf_type: UdfType
) -> tuple[np.ndarray, np.ndarray]:
    udf = remote_predict("text_hashing", udf_type=udf_type, config=config)
    result = (
        spark.range(ROWS, numPartitions=2)
        .withColumn("text", text_column())
        .select("id", udf("text").alias("p"))
        .toPandas()
        .sort_values("id")
    )
    return result["id"].to_numpy(), stacked(result["p"])


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_string_column_is_predicted_by_the_server_like_keras(
    spark: SparkSession, server: ServerProcess, example_repository: Path, protocol: str, udf_type: UdfType
) -> None:
    config = ClientConfig.model_validate(
        {"address": server.grpc_target(), "fallback": "error", "protocol": protocol}
    )
    ids, probabilities = predicted_texts(spark, config, udf_type)
    assert np.array_equal(ids, np.arange(ROWS))
    expected = reference_outputs(example_repository, "text_hashing", {"text": text_values(ids)})
    np.testing.assert_allclose(probabilities, expected["probabilities"], atol=1e-5)


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_with_no_server_a_string_column_is_predicted_on_the_cpu(
    spark: SparkSession, example_repository: Path, tmp_path: Path, udf_type: UdfType
) -> None:
    config = ClientConfig(
        address=f"unix://{tmp_path / 'no-server.sock'}", model_repository=str(example_repository)
    )
    ids, probabilities = predicted_texts(spark, config, udf_type)
    assert np.array_equal(ids, np.arange(ROWS))
    expected = reference_outputs(example_repository, "text_hashing", {"text": text_values(ids)})
    np.testing.assert_allclose(probabilities, expected["probabilities"], atol=1e-5)
