"""The Spark side of udfserve: UDFs that call the node's model server, with a CPU fallback.

    from udfserve.spark_client import remote_predict, predict_arrow, ClientConfig

    df.withColumn("p", remote_predict("tabular_mlp", "features"))
    predict_arrow(df, "tabular_mlp")
    predict_files("/data/features/", "tabular_mlp")   # parquet read by pyarrow in the workers

    with node_servers(spark, model_repository="/models") as nodes:   # no node installed on the hosts
        df.withColumn("p", remote_predict("tabular_mlp", "features", config=nodes.client_config()))

The names are resolved lazily: importing the package pulls in neither PySpark nor gRPC, and
nothing here ever imports TensorFlow or the server side (only the CPU fallback does, when used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from udfserve.spark_client.api.file_reads import predict_files
    from udfserve.spark_client.api.udf import arrow_predictor, predict_arrow, remote_predict
    from udfserve.spark_client.common.config import ClientConfig
    from udfserve.spark_client.nodes.node_context import node_servers

__all__ = [
    "ClientConfig",
    "arrow_predictor",
    "node_servers",
    "predict_arrow",
    "predict_files",
    "remote_predict",
]

_HOMES = {
    "ClientConfig": "udfserve.spark_client.common.config",
    "remote_predict": "udfserve.spark_client.api.udf",
    "predict_arrow": "udfserve.spark_client.api.udf",
    "arrow_predictor": "udfserve.spark_client.api.udf",
    "predict_files": "udfserve.spark_client.api.file_reads",
    "node_servers": "udfserve.spark_client.nodes.node_context",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'spark_client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
