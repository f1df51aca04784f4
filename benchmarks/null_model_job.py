"""The Spark application of ``benchmarks.null_model``: every udfserve path and its model-less
floor, in one session, on one cached DataFrame per null model, in rounds of alternating order.

    python -m benchmarks.null_model_job '{"models": {...}, "address": ..., ...}'

One session keeps the comparison to the paths themselves: the same JVM, the same cached rows, the
same Python workers' start paid once (an untimed pass over a small data set before the rounds).
Each timed run writes to the ``noop`` sink and records its wall seconds and the CPU seconds of
the JVM, of the Python workers (``pyspark.daemon`` and the workers it forks) and of the model
server. After the rounds, each contender's answer is checked once, untimed: every row back
exactly once with a prediction of the model's width, and the first rows' predictions equal to
their inputs' first values. Prints one JSON line of results.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import psutil

from benchmarks.null_models import INPUT, NULL_MODELS, OUTPUT, NullModel
from benchmarks.processes import PeakRssSampler
from benchmarks.spark_job import REPO_ROOT, _jvm, _python_workers

PATHS = ("remote_predict", "remote_predict_arrow", "predict_arrow", "predict_files")
FLOOR_OF = {
    "remote_predict": "pandas_udf",
    "remote_predict_arrow": "arrow_udf",
    "predict_arrow": "map_in_arrow",
    "predict_files": "map_in_arrow_files",
}
"""Each udfserve path's floor: the same kind of UDF doing the slice in the worker, no server."""
FLOORS = tuple(dict.fromkeys(FLOOR_OF.values()))
CONTENDERS = (*PATHS, *FLOORS)
ORDER = (
    "remote_predict",
    "pandas_udf",
    "remote_predict_arrow",
    "arrow_udf",
    "map_in_arrow",
    "predict_arrow",
    "predict_files",
    "map_in_arrow_files",
)
"""A round's order: each path next to its floor; odd rounds run it backwards (A B B A)."""
READS_FILES = ("predict_files", "map_in_arrow_files")
SAMPLE_ROWS = 64
logger = logging.getLogger("benchmarks.null_model_job")
GROUPS = ("JVM", "Python workers", "model server")


def _session(batch_rows: int) -> Any:
    from pyspark.sql import SparkSession

    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-bench-null-model")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
        .config("spark.sql.parquet.columnarReaderBatchSize", str(batch_rows))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def _files(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("*.parquet"))


def _contender_frame(
    spark: Any, name: str, model: NullModel, frame: Any, folder: str, job: dict[str, Any]
) -> Any:
    """``name``'s answer: ``frame`` (or ``folder``'s files) with an ``OUTPUT`` column."""
    from pyspark.sql.types import ArrayType, FloatType, LongType, StructField, StructType

    from benchmarks import null_model_floors
    from udfserve.spark_client import ClientConfig, predict_arrow, predict_files, remote_predict

    config = ClientConfig(
        address=job["address"],
        rows_per_request=job["rows_per_request"],
        bytes_per_request=job["bytes_per_request"],
        fallback="error",
    )
    prediction = StructField(OUTPUT, ArrayType(FloatType()))
    if name in ("remote_predict", "remote_predict_arrow"):
        udf_type: Literal["pandas", "arrow"] = "arrow" if name == "remote_predict_arrow" else "pandas"
        return frame.withColumn(OUTPUT, remote_predict(model.name, INPUT, udf_type=udf_type, config=config))
    if name == "predict_arrow":
        return predict_arrow(frame, model.name, [INPUT], [OUTPUT], config=config)
    if name == "predict_files":
        return predict_files(
            folder,
            model.name,
            input_columns=[INPUT],
            output_columns=[OUTPUT],
            keep_columns=["id"],
            read_batch_rows=job["batch_rows"],
            spark=spark,
            config=config,
        )
    if name == "pandas_udf":
        from pyspark.sql.functions import pandas_udf

        from benchmarks.inworker import passthrough_pandas_udf

        udf = pandas_udf(passthrough_pandas_udf(model.kept), returnType=ArrayType(FloatType()))  # type: ignore[call-overload]
        return frame.withColumn(OUTPUT, udf(INPUT))
    if name == "arrow_udf":
        from pyspark.sql.functions import arrow_udf

        # PySpark's stubs pick the overload from the function's form, which Spark reads at run time
        floor = arrow_udf(  # type: ignore[call-overload]
            null_model_floors.sliced_arrays(model.kept), returnType=ArrayType(FloatType())
        )
        return frame.withColumn(OUTPUT, floor(INPUT))
    if name == "map_in_arrow":
        schema = StructType([*frame.schema.fields, prediction])
        return frame.mapInArrow(null_model_floors.sliced_batches(INPUT, model.kept, OUTPUT), schema)
    if name == "map_in_arrow_files":
        paths = _files(folder)
        tasks = spark.createDataFrame(
            spark.sparkContext.parallelize([(p,) for p in paths], len(paths)), "path string"
        )
        schema = StructType([StructField("id", LongType()), prediction])
        return tasks.mapInArrow(
            null_model_floors.sliced_files(INPUT, model.kept, OUTPUT, job["batch_rows"]), schema
        )
    raise ValueError(f"unknown contender {name!r}; expected one of {', '.join(CONTENDERS)}")


def _cached(spark: Any, folder: str) -> tuple[Any, int]:
    frame = spark.read.parquet(folder).cache()
    return frame, frame.count()


def _expected(source: Any, model: NullModel) -> dict[int, list[float]]:
    """The first rows' answers: their inputs' first ``kept`` values."""
    return {r["id"]: r[INPUT][: model.kept] for r in source.where(f"id < {SAMPLE_ROWS}").collect()}


def _check(answer: Any, want: dict[int, list[float]], model: NullModel) -> dict[str, Any]:
    """Every row back once with ``kept`` values; the first rows' values equal to their inputs'."""
    from pyspark.sql import functions as F

    # one pass: a filter on ``id`` would run after a ``mapInArrow``, not below it
    counted = answer.agg(
        F.count("*").alias("rows"),
        F.countDistinct("id").alias("ids"),
        F.sum(F.size(OUTPUT)).alias("values"),
        F.collect_list(F.when(F.col("id") < SAMPLE_ROWS, F.struct("id", OUTPUT))).alias("sample"),
    ).first()
    got = {r["id"]: r[OUTPUT] for r in counted["sample"]}
    differences = [
        abs(a - b) for key, row in want.items() for a, b in zip(row, got.get(key) or [], strict=False)
    ]
    return {
        "checked_rows": counted["rows"],
        "distinct_ids": counted["ids"],
        "values": counted["values"] or 0,
        "sampled_rows": sum(1 for key in want if len(got.get(key) or []) == model.kept),
        "max_abs_difference": max(differences, default=float("nan")),
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    spark = _session(job["batch_rows"])
    server = psutil.Process(job["server_pid"])
    samplers = {
        "JVM": PeakRssSampler(_jvm, interval_s=0.5),
        "Python workers": PeakRssSampler(_python_workers, interval_s=0.5),
        "model server": PeakRssSampler(lambda: [server], interval_s=0.5),
    }
    results: dict[str, Any] = {}
    for sampler in samplers.values():
        sampler.__enter__()
    try:
        for name, data in job["models"].items():
            results[name] = _run_model(spark, NULL_MODELS[name], data, job, samplers)
    finally:
        for sampler in samplers.values():
            sampler.__exit__()
    spark.stop()
    return {"models": results}


def _run_model(
    spark: Any,
    model: NullModel,
    data: dict[str, Any],
    job: dict[str, Any],
    samplers: dict[str, PeakRssSampler],
) -> dict[str, Any]:
    frame, rows = _cached(spark, data["folder"])
    answers: dict[str, Callable[[], Any]] = {
        name: functools.partial(_contender_frame, spark, name, model, frame, data["folder"], job)
        for name in job["contenders"]
    }
    if job["warm_up"]:
        _warm_up(spark, model, data["small"], job)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in job["contenders"]}
    order = [name for name in ORDER if name in job["contenders"]]
    for round_index in range(job["rounds"]):
        for name in order if round_index % 2 == 0 else order[::-1]:
            answer = answers[name]()
            before = {group: sampler.cpu_snapshot() for group, sampler in samplers.items()}
            started = time.perf_counter()
            _write(answer)
            seconds = time.perf_counter() - started
            cpu_s = {group: sampler.cpu_since(before[group]) for group, sampler in samplers.items()}
            runs[name].append({"round": round_index, "seconds": seconds, "cpu_s": cpu_s})
            logger.info("%s %s round %d: %.2f s, CPU %s", model.name, name, round_index + 1, seconds, cpu_s)
    contenders = {}
    want = _expected(frame, model)
    for name in job["contenders"]:
        answer = answers[name]()
        tasks = answer if name in READS_FILES else frame
        contenders[name] = {
            "runs": runs[name],
            "tasks": tasks.rdd.getNumPartitions(),
            **_check(answer, want, model),
        }
    frame.unpersist()
    return {"rows": rows, "contenders": contenders}


def _warm_up(spark: Any, model: NullModel, folder: str, job: dict[str, Any]) -> None:
    """Every contender once, untimed, over a small data set, so that no round pays the workers'
    start, the client's import and connection, or the server's first call."""
    small, _ = _cached(spark, folder)
    for name in job["contenders"]:
        _write(_contender_frame(spark, name, model, small, folder, job))
    small.unpersist()


def _write(answer: Any) -> None:
    answer.write.format("noop").mode("overwrite").save()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    print(json.dumps(run(json.loads(args[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
