"""On the happy path a Spark Python worker imports no framework (TensorFlow, torch) nor the server side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from spark_data import feature_column

from services.model_server.launcher import ServerProcess
from spark_client import ClientConfig, arrow_predictor


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_worker_that_predicts_through_the_server_never_imports_tensorflow(
    spark: SparkSession, server: ServerProcess, protocol: str
) -> None:
    """The check runs in the worker, after its predictions, in the same Arrow function; the fallback
    is off, so a CPU fallback cannot have answered instead (it would import TensorFlow)."""
    predictor = arrow_predictor(
        "tabular_mlp", config=ClientConfig(address=server.grpc_target(), fallback="error", protocol=protocol)
    )

    def predict_then_list_heavy_modules(batches: Iterator[object]) -> Iterator[object]:
        import sys

        import pyarrow as pa

        for batch in predictor(batches):  # type: ignore[arg-type]
            heavy = sorted(
                name
                for name in sys.modules
                if name.split(".")[0] in {"tensorflow", "keras", "torch", "services"}
            )
            yield batch.append_column("heavy_modules", pa.array([",".join(heavy)] * batch.num_rows))

    frame = spark.range(20_000, numPartitions=2).withColumn("features", feature_column((64,)))
    schema = T.StructType(
        [*frame.schema.fields, *predictor.output_fields(), T.StructField("heavy_modules", T.StringType())]
    )
    rows = (
        frame.mapInArrow(predict_then_list_heavy_modules, schema).select("heavy_modules").distinct().collect()
    )
    assert [row.heavy_modules for row in rows] == [""]
