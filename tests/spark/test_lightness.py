"""On the happy path a Spark Python worker imports no framework (TensorFlow, ONNX Runtime, PyTorch)
and nothing of the server side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import feature_column

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, arrow_predictor


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_worker_that_predicts_through_the_server_never_imports_tensorflow(
    fresh_python_workers: None, spark: SparkSession, server: ServerProcess, protocol: str
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
                if name.split(".")[0] in {"tensorflow", "keras", "onnxruntime", "onnx", "torch"}
                or name.startswith("udfserve.services")
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


def test_a_worker_that_predicts_an_onnx_model_through_the_server_never_imports_onnxruntime(
    fresh_python_workers: None, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same check against a server of an ONNX graph: the client's happy path is the same
    whatever backend the server runs."""
    from onnx_graphs import scored_graph, write_model

    from udfserve.services.model_server.launcher import launch_server

    root = tmp_path_factory.mktemp("onnx_lightness")
    write_model(root / "repository", "scored", scored_graph())
    onnx_server = launch_server(root / "repository", socket=root / "grpc.sock", port=0, http_port=0)
    try:
        predictor = arrow_predictor(
            "scored", config=ClientConfig(address=onnx_server.grpc_target(), fallback="error")
        )

        def predict_then_list_frameworks(batches: Iterator[object]) -> Iterator[object]:
            import sys

            import pyarrow as pa

            for batch in predictor(batches):  # type: ignore[arg-type]
                frameworks = sorted(
                    name for name in sys.modules if name.split(".")[0] in {"onnxruntime", "onnx", "torch"}
                )
                yield batch.append_column("frameworks", pa.array([",".join(frameworks)] * batch.num_rows))

        frame = spark.range(5_000, numPartitions=2).select(
            "id",
            feature_column((3,)).alias("amount"),  # type: ignore[attr-defined]
            (F.col("id") % 10).cast("long").alias("code"),
        )
        schema = T.StructType(
            [*frame.schema.fields, *predictor.output_fields(), T.StructField("frameworks", T.StringType())]
        )
        rows = (
            frame.mapInArrow(predict_then_list_frameworks, schema).select("frameworks").distinct().collect()
        )
    finally:
        onnx_server.terminate()
    assert [row.frameworks for row in rows] == [""]
