"""The four ways the client answers rows, run from a Spark Connect session, and the checks of their
answers against ``tabular_mlp`` run in this process."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from tests.spark.spark_data import feature_column, feature_values, reference_outputs, stacked
from udfserve.spark_client import ClientConfig, predict_arrow, predict_files, remote_predict

FEATURES = (64,)
"""The per-row shape of ``tabular_mlp``'s input ``features``; its one output is ``probabilities``."""

PATHS = ("remote_predict-pandas", "remote_predict-arrow", "predict_arrow", "predict_files")
"""``remote_predict`` as a pandas UDF and as an Arrow UDF, ``predict_arrow`` (``mapInArrow``), and
``predict_files`` (parquet read by pyarrow in the Python workers)."""


def tabular_frame(spark: SparkSession, rows: int, partitions: int = 2) -> DataFrame:
    """``id`` and ``features`` (the values of ``feature_values``), computed by Spark."""
    return spark.range(rows, numPartitions=partitions).withColumn("features", feature_column(FEATURES))


def write_tabular_files(folder: Path, rows: int, files: int = 2) -> None:
    """``id`` and ``features`` of ``range(rows)`` in ``files`` parquet files, as Spark writes arrays."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for part, (start, end) in enumerate(itertools.pairwise(bounds)):
        ids = np.arange(start, end)
        flat = pa.array(feature_values(ids, FEATURES).ravel())
        values = pa.FixedSizeListArray.from_arrays(flat, FEATURES[0])
        table = pa.table({"id": ids, "features": values.cast(pa.list_(pa.float32()))})
        pq.write_table(table, folder / f"part-{part}.parquet", row_group_size=1_000)


def predicted(
    path: str, spark: SparkSession, rows: int, config: ClientConfig, folder: Path, with_version: bool = False
) -> DataFrame:
    """``id`` and ``probabilities`` (and ``model_version`` with ``with_version``) of ``range(rows)``,
    answered through ``path``; ``predict_files`` reads files it writes under ``folder``."""
    outputs = ["probabilities", "model_version"] if with_version else ["probabilities"]
    if path.startswith("remote_predict-"):
        udf_type = path.removeprefix("remote_predict-")
        predict = remote_predict("tabular_mlp", udf_type=udf_type, with_version=with_version, config=config)
        answered = tabular_frame(spark, rows).select("id", predict("features").alias("answer"))
        if not with_version:
            return answered.withColumnRenamed("answer", "probabilities")
        return answered.select("id", *(f"answer.{name}" for name in outputs))
    if path == "predict_arrow":
        frame = predict_arrow(
            tabular_frame(spark, rows), "tabular_mlp", with_version=with_version, config=config
        )
        return frame.select("id", *outputs)
    if path == "predict_files":
        write_tabular_files(folder, rows)
        return predict_files(
            str(folder), "tabular_mlp", with_version=with_version, config=config, spark=spark
        )
    raise ValueError(f"unknown path {path!r}; expected one of {PATHS}")


def tabular_expected(repository: Path, ids: np.ndarray, version: int = 1) -> np.ndarray:
    """``tabular_mlp``'s probabilities for ``ids``, from the model file run in this process."""
    inputs = {"features": feature_values(ids, FEATURES)}
    return reference_outputs(repository, "tabular_mlp", inputs, version)["probabilities"]


def assert_every_row_once_as_the_model(result: Any, repository: Path, rows: int, version: int = 1) -> None:
    """``result`` (a pandas frame) holds each id of ``range(rows)`` exactly once, and in
    ``probabilities`` the answer of ``version`` of the model for it (1e-5)."""
    ids = result["id"].to_numpy()
    assert len(ids) == rows, f"expected {rows} rows, received {len(ids)}"
    assert np.array_equal(np.sort(ids), np.arange(rows)), "expected every id of range(rows) exactly once"
    ordered = result.sort_values("id")
    expected = tabular_expected(repository, np.arange(rows), version)
    np.testing.assert_allclose(stacked(ordered["probabilities"]), expected, atol=1e-5)
