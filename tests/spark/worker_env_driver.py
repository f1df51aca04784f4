"""Driver program of the worker-environment tests: builds one UDF and runs it on local Spark.

Run as a separate process with the ``PYSPARK_PYTHON`` under test (this test process already
holds a SparkContext, started with its own interpreter). Prints one JSON object: the rows the
job answered, or the type and message of the error building the UDF raised.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict
from udfserve.spark_client.common.errors import RemotePredictError


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--udf", choices=("remote_predict", "predict_arrow"), default="remote_predict")
    args = parser.parse_args()

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("udfserve-worker-environment-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    try:
        frame = spark.range(args.rows, numPartitions=1).select(
            F.array(*[F.lit(0.5).cast("float") for _ in range(64)]).alias("features")
        )
        config = ClientConfig(address=args.address, fallback="error")
        try:
            if args.udf == "predict_arrow":
                scored = predict_arrow(frame, "tabular_mlp", config=config)
            else:
                scored = frame.select(remote_predict("tabular_mlp", "features", config=config).alias("p"))
        except RemotePredictError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            return 0
        print(json.dumps({"rows": len(scored.collect())}))  # count() would skip the UDF
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
