"""On the happy path a Spark Python worker imports no framework (TensorFlow, ONNX Runtime, PyTorch),
nothing of the server side, and no pydantic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import feature_column

from udfserve.discovery import NodeDiscovery, ServerEntry, write_discovery
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, arrow_predictor, remote_predict


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


@pytest.mark.parametrize("found_by", ["address", "discovery file"])
def test_a_pandas_udf_worker_that_predicts_through_the_server_never_imports_pydantic(
    fresh_python_workers: None, spark: SparkSession, server: ServerProcess, tmp_path: Path, found_by: str
) -> None:
    """pydantic is about 15 MiB of each Python worker (docs/benchmarks.md): the job carries a plain
    ``TaskConfig`` and the node's discovery file is read without it. ``remote_predict``'s own
    function answers in the worker, then the check runs in the same pandas UDF; the fallback is off,
    so the server answered every row."""
    if found_by == "address":
        config = ClientConfig(address=server.grpc_target(), fallback="error")
    else:  # no address: each task reads the node's discovery file
        entry = ServerEntry(device="cpu", unix_socket=server.unix_socket, tcp_address=server.tcp_address)
        write_discovery(tmp_path / "discovery.json", NodeDiscovery(servers=[entry]))
        config = ClientConfig(discovery_file=str(tmp_path / "discovery.json"), fallback="error")
    predict = remote_predict("tabular_mlp", config=config).spark_udf.func

    def predict_then_list_pydantic(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        import sys

        for answer in predict(batches):
            loaded = sorted(name for name in sys.modules if name.split(".")[0] == "pydantic")
            yield pd.Series([",".join(loaded)] * len(answer))

    check = F.pandas_udf(predict_then_list_pydantic, "string")  # type: ignore[call-overload]
    frame = spark.range(20_000, numPartitions=2).withColumn("features", feature_column((64,)))
    rows = frame.select(check("features").alias("pydantic")).groupBy("pydantic").count().collect()
    assert [(row.pydantic, row["count"]) for row in rows] == [("", 20_000)]
