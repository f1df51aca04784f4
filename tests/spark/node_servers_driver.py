"""Driver program of the node_servers tests: one Spark application, driven step by step.

Run as a process of its own (the test process holds a local SparkContext, and a test kills
drivers with SIGKILL). It reads one JSON command per line on stdin and answers each with one
line on stdout, ``ANSWER`` followed by JSON (other lines on stdout are not answers):

- ``{"do": "start", ...}``: enter ``node_servers`` (its keyword arguments given in the command);
  answers the hosts' nodes and the application id;
- ``{"do": "executors", "count": N}``: wait until N executors are registered;
- ``{"do": "job", "rows": N, "partitions": P}``: score N rows with the context's config, each row
  tagged with the node its task ran on (its worker's ``UDFSERVE_NODE_NAME``); answers the rows,
  the distinct ids, the rows per node, and the client's counters where Spark has accumulators;
- ``{"do": "exit"}``: leave the context (the driver stays up);
- ``{"do": "quit"}``: stop the session and exit.

An exception answers ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from udfserve.spark_client import arrow_predictor, node_servers

NODE_NAME_ENV = "UDFSERVE_NODE_NAME"
ANSWER = "@@answer "


def session(args: argparse.Namespace) -> Any:
    if args.connect:
        builder = SparkSession.builder.remote("local[2]")
    else:
        builder = (
            SparkSession.builder.master(args.master)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.cores.max", str(args.cores_max))
        )
    return (
        builder.appName(args.app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .getOrCreate()
    )


def wait_for_executors(spark: Any, count: int, timeout_s: float = 180.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        found = int(spark.sparkContext._jsc.sc().getExecutorIds().size())
        if found >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def run_job(spark: Any, nodes: Any, rows: int, partitions: int) -> dict[str, object]:
    predictor = arrow_predictor("tabular_mlp", config=nodes.client_config(rows_per_request=500))

    def predict_and_tag(batches: Iterator[object]) -> Iterator[object]:
        import os

        import pyarrow as pa

        node = os.environ.get(NODE_NAME_ENV, "")
        for batch in predictor(batches):  # type: ignore[arg-type]
            yield batch.append_column("node", pa.array([node] * batch.num_rows))

    frame = spark.range(rows, numPartitions=partitions).withColumn(
        "features",
        F.transform(F.sequence(F.lit(0), F.lit(63)), lambda j: ((F.col("id") + j) % 10 / 10.0).cast("float")),
    )
    schema = T.StructType(
        [*frame.schema.fields, *predictor.output_fields(), T.StructField("node", T.StringType())]
    )
    tagged = frame.mapInArrow(predict_and_tag, schema).select("id", "node").toPandas()
    answer: dict[str, object] = {
        "rows": len(tagged),
        "distinct_ids": int(tagged["id"].nunique()),
        "rows_by_node": {str(k): int(v) for k, v in tagged.groupby("node").size().items()},
    }
    with contextlib.suppress(RuntimeError):  # no accumulators under Spark Connect
        stats = predictor.stats()
        answer["rows_by_server"], answer["rows_by_fallback"] = stats.rows_by_server, stats.rows_by_fallback
    return answer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", default="")
    parser.add_argument("--connect", action="store_true")
    parser.add_argument("--cores-max", type=int, default=2)
    parser.add_argument("--app-name", default="udfserve-node-servers-test")
    args = parser.parse_args()
    spark = session(args)
    context: Any = None
    nodes: Any = None
    try:
        for line in sys.stdin:
            command = json.loads(line)
            action = command.pop("do")
            try:
                if action == "start":
                    context = node_servers(spark, **command)
                    nodes = context.__enter__()
                    answer: dict[str, object] = {
                        "hosts": [dataclasses.asdict(host) for host in nodes.hosts],
                        "app_id": spark.conf.get("spark.app.id"),
                    }
                elif action == "executors":
                    answer = {"executors": wait_for_executors(spark, command["count"])}
                elif action == "job":
                    answer = run_job(spark, nodes, command["rows"], command["partitions"])
                elif action == "exit":
                    context.__exit__(None, None, None)
                    context = None
                    answer = {"exited": True}
                elif action == "quit":
                    break
                else:
                    answer = {"error": f"unknown command {action!r}"}
            except Exception as exc:  # reported to the test, which fails naming it
                answer = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            sys.stdout.write(ANSWER + json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        if context is not None:
            context.__exit__(None, None, None)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
