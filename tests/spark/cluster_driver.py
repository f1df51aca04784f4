"""Driver program of the standalone-cluster tests: one prediction job, then where its rows ran.

Run as a separate process (this test process already holds a local SparkContext). Each row is
predicted through ``arrow_predictor`` with the fallback off, and tagged, in the same Python
worker pass, with the node the task ran on (its worker's ``UDFSERVE_DISCOVERY_FILE``) and the
GPU Spark assigned to it. Prints one JSON object: rows per (node, gpu) and the distinct row ids.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from udfserve.spark_client import ClientConfig, arrow_predictor


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--executors", type=int, required=True)
    parser.add_argument("--gpu-per-task", action="store_true")
    args = parser.parse_args()

    builder = (
        SparkSession.builder.master(args.master)
        .appName("udfserve-cluster-test")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", str(args.executors))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        # Schedule nothing until every executor is registered, so tasks spread over both nodes.
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "180s")
    )
    if args.gpu_per_task:
        builder = builder.config("spark.executor.resource.gpu.amount", "1").config(
            "spark.task.resource.gpu.amount", "1"
        )
    spark = builder.getOrCreate()
    try:
        predictor = arrow_predictor(
            "tabular_mlp", config=ClientConfig(fallback="error", rows_per_request=500)
        )

        def predict_and_tag(batches: Iterator[object]) -> Iterator[object]:
            import os

            import pyarrow as pa
            from pyspark import TaskContext

            context = TaskContext.get()
            gpus = context.resources().get("gpu") if context else None
            gpu = gpus.addresses[0] if gpus and gpus.addresses else ""
            node = os.environ.get("UDFSERVE_DISCOVERY_FILE", "")
            for batch in predictor(batches):  # type: ignore[arg-type]
                rows = batch.num_rows
                yield batch.append_column("node", pa.array([node] * rows)).append_column(
                    "gpu", pa.array([gpu] * rows)
                )

        frame = spark.range(args.rows, numPartitions=args.partitions).withColumn(
            "features",
            F.transform(
                F.sequence(F.lit(0), F.lit(63)), lambda j: ((F.col("id") + j) % 10 / 10.0).cast("float")
            ),
        )
        schema = T.StructType(
            [
                *frame.schema.fields,
                *predictor.output_fields(),
                T.StructField("node", T.StringType()),
                T.StructField("gpu", T.StringType()),
            ]
        )
        tagged = frame.mapInArrow(predict_and_tag, schema).select("id", "node", "gpu").toPandas()
        counts = tagged.groupby(["node", "gpu"]).size()
        json.dump(
            {
                "rows_by_node_and_gpu": [[node, gpu, int(rows)] for (node, gpu), rows in counts.items()],
                "rows": len(tagged),
                "distinct_ids": int(tagged["id"].nunique()),
            },
            sys.stdout,
        )
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
