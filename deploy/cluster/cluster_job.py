"""One job of the container cluster (scripts/cluster_smoke.sh), run in the driver container.

N rows with the ids 0..N-1 and features made from each id are scored through ``arrow_predictor`` on
``mapInArrow`` and written to the shared output folder as parquet by Spark's own committer. Each
row is tagged, in the same Python worker pass, with the host its task ran on (the worker's host
name: one per node), its partition and its task attempt, so that the output, read back afterwards
by ``cluster_figures.py output``, says which node computed which row. Nothing is counted here that
the output or the servers count: this program prints what only the driver knows.

Printed on stdout, one line each: ``APP <application id>`` as soon as the session runs (the script
watches the servers' per-application counts by it), then ``JOB <json>``: the client's counters (the
UDF's accumulator), the time of the write, and Spark's own record of the tasks (host, executor,
status, for every attempt) and executors, read from the driver's REST API before the session stops.

A gate holds the tasks of the partitions from ``--hold-from-partition`` on until a file exists
(``--gate``): the script opens it once what it waits for happened (a node joined the job, every
node serves the new version), so that the rest of the job runs after it, whatever the machine's
speed.

Pauses stop a task of one host in its middle: ``--pause-host`` names the host, ``--pause-after-rows``
the rows the task has scored at each pause and ``--pause-gates`` the file that ends each (as many of
each). At a pause the task writes ``<gate>.waiting`` (where it stopped, as JSON) and waits for the
gate; the script does what it waits for, then makes the gate (check b: the server killed while the
victim's first task is stopped, the restarted server ready before the rest of it runs). A pause
also lasts until ``--pause-min-s`` has passed since the one before, so that a circuit the client
opened at the first failure after it has closed again (its ``circuit_reset_s``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

MODEL = "tabular_mlp"
MASTER = "spark://spark-master:7077"
UI = "http://127.0.0.1:4040/api/v1"


def say(line: str) -> None:
    """One line of this program's answer, on stdout at once (the script reads it while the job runs)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the check this job is for: its app name and job group")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--output", required=True, help="folder the committer writes (in the shared volume)")
    parser.add_argument("--executors", type=int, required=True, help="executors to wait for before scoring")
    parser.add_argument("--with-version", action="store_true", help="add each row's model version")
    parser.add_argument("--hold-from-partition", type=int, default=-1)
    parser.add_argument("--gate", default="", help="file whose existence releases the held partitions")
    parser.add_argument("--gate-timeout-s", type=float, default=900.0)
    parser.add_argument("--pause-host", default="", help="the host whose tasks stop at the pauses")
    parser.add_argument(
        "--pause-after-rows", default="", help="comma-separated: rows a task has scored at each pause"
    )
    parser.add_argument("--pause-gates", default="", help="comma-separated: the file that ends each pause")
    parser.add_argument(
        "--pause-min-s",
        type=float,
        default=0.0,
        help="a pause after the first lasts at least this long after the one before ended",
    )
    parser.add_argument("--servers-from-job", action="store_true", help="the job starts the nodes' servers")
    parser.add_argument(
        "--hold-nodes-until",
        default="",
        help="with --servers-from-job: once the output is written, keep the nodes until this file exists",
    )
    return parser.parse_args(argv)


def spark_session(name: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(MASTER)
        .appName(f"udfserve-cluster-{name}")
        .config("spark.driver.host", "driver")
        .config("spark.driver.bindAddress", "0.0.0.0")
        .config("spark.driver.memory", "1g")
        .config("spark.executor.memory", "768m")
        .config("spark.executor.cores", "1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "4096")
        # The node's shared-memory folder (the same path on every node), and the repository the CPU
        # fallback loads from: the shared model volume, mounted in every worker.
        .config("spark.udfserve.sharedMemoryDir", "/run/udfserve-shm")
        .config("spark.udfserve.modelRepository", "/models")
        .getOrCreate()
    )


def rest(spark: Any, path: str) -> Any:
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{UI}/applications/{app}{path}", timeout=30) as answer:
        return json.load(answer)


def wait_for_executors(spark: Any, count: int, timeout_s: float = 300.0) -> None:
    """Scoring starts once ``count`` executors are registered, so that the tasks spread over every
    node rather than over the first executors to arrive (standalone mode schedules at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        executors = [e for e in rest(spark, "/executors") if e["id"] != "driver"]
        if len(executors) >= count:
            return
        if time.monotonic() > deadline:
            hosts = sorted(e["hostPort"] for e in executors)
            raise SystemExit(
                f"only {len(executors)} executors registered within {timeout_s:.0f} s ({hosts}); "
                f"expected {count}"
            )
        time.sleep(0.5)


def features(spark: Any, rows: int, partitions: int, width: int) -> Any:
    """ids 0..rows-1 and ``width`` float32 features of each id, the formula ``cluster_figures``
    recomputes to check the predictions: ((id * 7919 + j * 104729) % 1000) / 1000 - 0.5."""
    from pyspark.sql import functions as F

    def value(j: Any) -> Any:
        return (((F.col("id") * 7919 + j * 104729) % 1000) / F.lit(1000.0) - F.lit(0.5)).cast("float")

    column = F.transform(F.sequence(F.lit(0), F.lit(width - 1)), value)
    return spark.range(0, rows, numPartitions=partitions).withColumn("features", column)


@dataclasses.dataclass(frozen=True)
class Pauses:
    """Where the first-wave tasks of one host stop (``--pause-*``)."""

    host: str = ""
    after_rows: tuple[int, ...] = ()
    gates: tuple[str, ...] = ()
    min_s: float = 0.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Pauses:
        rows = tuple(int(r) for r in args.pause_after_rows.split(",") if r)
        gates = tuple(g for g in args.pause_gates.split(",") if g)
        if len(rows) != len(gates) or (rows and not args.pause_host):
            raise SystemExit("--pause-after-rows and --pause-gates take as many values, with --pause-host")
        return cls(args.pause_host, rows, gates, args.pause_min_s)


def wait_for_gate(gate: str, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} waited {timeout_s:.0f} s for {gate}, which was not made")
        time.sleep(0.2)


def tagged(
    predictor: Any, with_version: bool, gate: str, hold_from: int, gate_timeout_s: float, pauses: Pauses
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: the partition scored by ``predictor``, each row with its output, its
    version (when asked), and where its task ran."""
    output = predictor.output_columns[0]

    def pause(index: int, partition: int, scored: int, since: float) -> float:
        """Stop at pause ``index``: say where, wait for its gate (and the least time); its end."""
        gate = pauses.gates[index]
        with open(gate + ".waiting", "w") as handle:
            json.dump({"partition": partition, "rows_scored": scored, "at": time.time()}, handle)
        wait_for_gate(gate, gate_timeout_s, f"partition {partition}, paused after {scored} rows,")
        if index > 0:
            time.sleep(max(0.0, since + pauses.min_s - time.monotonic()))
        return time.monotonic()

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import socket

        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        if gate and 0 <= hold_from <= partition:
            wait_for_gate(gate, gate_timeout_s, f"partition {partition}")
        host = socket.gethostname()
        # The first wave's tasks on the pause host (the held partitions run after the pauses).
        first_wave = host == pauses.host and attempt == 0 and partition < hold_from
        stops = list(pauses.after_rows) if first_wave else []
        scored, index, since = 0, 0, time.monotonic()
        for batch in predictor(batches):
            rows = batch.num_rows
            scored += rows
            columns = [batch.column("id"), batch.column(output)]
            names = ["id", output]
            if with_version:
                columns.append(batch.column("model_version"))
                names.append("model_version")
            columns += [
                pa.array([host] * rows, pa.string()),
                pa.array([partition] * rows, pa.int32()),
                pa.array([attempt] * rows, pa.int32()),
            ]
            yield pa.RecordBatch.from_arrays(columns, names=[*names, "host", "partition", "attempt"])
            while index < len(stops) and scored >= stops[index]:
                since = pause(index, partition, scored, since)
                index += 1

    return run


def task_record(spark: Any, group: str) -> dict[str, Any]:
    """Every attempt of every task of the job group, as Spark's UI recorded it, and the executors."""
    tracker = spark.sparkContext.statusTracker()
    tasks = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            for attempt in rest(spark, f"/stages/{stage}"):
                listed = rest(spark, f"/stages/{stage}/{attempt['attemptId']}/taskList?length=100000")
                tasks += [
                    {
                        "stage": stage,
                        "partition": t["index"],
                        "attempt": t["attempt"],
                        "host": t["host"],
                        "executor": t["executorId"],
                        "status": t["status"],
                        "launched": t.get("launchTime", ""),
                        "error": (t.get("errorMessage") or "").splitlines()[0][:300]
                        if t.get("errorMessage")
                        else "",
                    }
                    for t in listed
                ]
    executors = [
        {
            "id": e["id"],
            "host": e["hostPort"].rsplit(":", 1)[0],
            "active": e["isActive"],
            "added": e.get("addTime", ""),
            "removed": e.get("removeTime", ""),
            "removed_reason": e.get("removeReason", ""),
            "completed_tasks": e["completedTasks"],
            "failed_tasks": e["failedTasks"],
        }
        for e in rest(spark, "/allexecutors")
        if e["id"] != "driver"
    ]
    return {"tasks": tasks, "executors": executors}


def servers_from_job(spark: Any, enabled: bool) -> AbstractContextManager[Any]:
    """The nodes' servers, started by this job on every executor's host (``node_servers``: a barrier
    stage of one task per executor, one detached ``udfserve node`` per host, stopped when the
    context ends), or nothing to do. The nodes take the rest of their settings from the executors'
    environment, as a node installed on the host would (deploy/cluster/node.yml)."""
    if not enabled:
        return nullcontext()
    from udfserve.spark_client import node_servers

    return node_servers(spark, model_repository="/models", devices="cpu", models=(MODEL,))


def wait_for_file(path: str, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {path} was not made within {timeout_s:.0f} s")
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    spark = spark_session(args.name)
    spark.sparkContext.setLogLevel("WARN")
    say(f"APP {spark.sparkContext.applicationId}")
    try:
        wait_for_executors(spark, args.executors)
        from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

        from udfserve.spark_client import arrow_predictor

        with servers_from_job(spark, args.servers_from_job) as nodes:
            config = None
            if nodes is not None:
                say("NODES " + json.dumps([dataclasses.asdict(host) for host in nodes.hosts]))
                config = nodes.client_config()
            predictor = arrow_predictor(MODEL, with_version=args.with_version, config=config)
            [tensor] = predictor.job.spec.inputs
            frame = features(spark, args.rows, args.partitions, tensor.shape[0])
            fields = [StructField("id", LongType(), False), *predictor.output_fields()]
            schema = StructType(
                [
                    *fields,
                    StructField("host", StringType()),
                    StructField("partition", IntegerType()),
                    StructField("attempt", IntegerType()),
                ]
            )
            run = tagged(
                predictor,
                args.with_version,
                args.gate,
                args.hold_from_partition,
                args.gate_timeout_s,
                Pauses.from_args(args),
            )
            spark.sparkContext.setJobGroup(args.name, f"cluster check {args.name}: {args.rows} rows")
            started = time.monotonic()
            frame.mapInArrow(run, schema).write.mode("overwrite").parquet(args.output)
            seconds = time.monotonic() - started
            if nodes is not None and args.hold_nodes_until:
                say("WRITTEN")
                wait_for_file(args.hold_nodes_until, 1800.0, "the nodes were held for the script's figures")
        record = task_record(spark, args.name)
        report = {
            "name": args.name,
            "app_id": spark.sparkContext.applicationId,
            "rows": args.rows,
            "partitions": args.partitions,
            "seconds": round(seconds, 2),
            "stats": dataclasses.asdict(predictor.stats()),
            # How the client chose versions (docs/model_lifecycle.md): "job" computes every row with
            # the version serving when the UDF was built, "request" each request with the one serving.
            "version_consistency": getattr(predictor.job.config, "version_consistency", "request"),
            "version_at_build": predictor.job.spec.version,
            **record,
        }
        say("JOB " + json.dumps(report))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
