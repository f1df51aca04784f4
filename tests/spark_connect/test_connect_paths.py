"""Every UDF kind and ``predict_files`` from a Spark Connect session against a real model server:
each row answered once, as the model answers it in this process, and the version column."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from tests.spark_connect.connect_data import PATHS, assert_every_row_once_as_the_model, predicted
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig

ROWS = 20_000


@pytest.mark.parametrize("path", PATHS)
def test_every_row_is_answered_once_as_the_model_answers_it(
    connect_spark: SparkSession, server: ServerProcess, example_repository: Path, tmp_path: Path, path: str
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    frame = predicted(path, connect_spark, ROWS, config, tmp_path / "files")

    assert frame.columns == ["id", "probabilities"]
    assert frame.schema["probabilities"].dataType == T.ArrayType(T.FloatType(), containsNull=False)
    assert_every_row_once_as_the_model(frame.toPandas(), example_repository, ROWS)


@pytest.mark.parametrize("path", PATHS)
def test_each_row_carries_the_version_that_computed_it(
    connect_spark: SparkSession,
    versioned_server: ServerProcess,
    tabular_version_2: Path,
    tmp_path: Path,
    path: str,
) -> None:
    """The server serves version 2 of the two: every row says 2 and holds version 2's answer."""
    config = ClientConfig(address=versioned_server.grpc_target(), fallback="error")
    frame = predicted(path, connect_spark, ROWS // 4, config, tmp_path / "files", with_version=True)

    assert frame.columns == ["id", "probabilities", "model_version"]
    assert frame.schema["model_version"].dataType == T.LongType()
    rows = frame.toPandas()
    assert rows["model_version"].value_counts().to_dict() == {2: ROWS // 4}
    assert_every_row_once_as_the_model(rows, tabular_version_2.parent.parent, ROWS // 4, version=2)
