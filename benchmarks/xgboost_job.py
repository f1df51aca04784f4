"""One Spark application scoring the XGBoost example ``tabular_xgb`` with one contender, in its own
process, for ``benchmarks.xgboost_scoring``. The parent passes a JSON job and reads one JSON line:

    python -m benchmarks.xgboost_job '{"contender": "remote_predict", "data": "...", ...}'

Contenders, each as its users write it:

- ``remote_predict``: udfserve's pandas UDF, the booster in a model server (``address``);
- ``predict_batch_udf``: Spark's own, the booster loaded once per Python worker (its cache) and
  called with ``Booster.inplace_predict`` on each batch, XGBoost's own threads;
- ``xgboost.spark``: XGBoost's estimator, ``SparkXGBClassifierModel.transform``, the model loaded
  from the same file into an ``XGBClassifier`` on the driver and shipped to the workers by Spark.

A measured application is fresh (its own driver, JVM and Python workers) and runs one contender
(a quick run runs the three in one application); each contender's job runs ``runs`` times into
the ``noop`` sink, and reports each run's wall time and CPU seconds by process group (Python
workers, JVM, the model server for ``remote_predict``), and the probability of class 1 of the
first rows, to check answers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.processes import PeakRssSampler, run_json_child

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("remote_predict", "predict_batch_udf", "xgboost.spark")
MODEL = "tabular_xgb"
INPUT = "features"
SAMPLE_ROWS = 64
BATCH_ROWS = 4096
"""Rows per call of every contender: the client's request, predict_batch_udf's batch, Arrow's."""


@dataclass
class XgbJob:
    contenders: list[str]
    """Run one after the other in this application: one for a measure (a fresh application each),
    all of them in a quick run (one application's start instead of three)."""
    data: str
    """A parquet folder of ``id`` and ``features`` (32 floats)."""
    model_file: str
    features: int
    address: str = ""
    server_pid: int = 0
    """The model server's process, whose CPU time counts for ``remote_predict``."""
    runs: int = 2
    log_file: str = ""


@dataclass
class XgbJobResult:
    contender: str
    rows: int
    partitions: int
    runs_s: list[float] = field(default_factory=list)
    runs_cpu_s: list[dict[str, float]] = field(default_factory=list)
    """CPU seconds of each run by process group: Python workers, JVM, model server."""
    peak_worker_rss_total_mib: float = 0.0
    sample: dict[str, float] = field(default_factory=dict)
    """id -> the probability of class 1, for the first ``SAMPLE_ROWS`` ids."""

    @property
    def best_run(self) -> int:
        """The fastest run after the first (which pays the workers' start), or the only one."""
        candidates = range(1, len(self.runs_s)) if len(self.runs_s) > 1 else range(len(self.runs_s))
        return min(candidates, key=lambda index: self.runs_s[index])


def booster_predict_fn(model_file: str) -> Callable[[np.ndarray], np.ndarray]:
    """``predict_batch_udf``'s ``make_predict_fn``: the booster loaded once per Python worker."""
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(model_file)

    def predict(features: np.ndarray) -> np.ndarray:
        answer: np.ndarray = booster.inplace_predict(features)
        return answer

    return predict


def _session(job: XgbJob) -> Any:
    from pyspark.sql import SparkSession

    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName(f"udfserve-bench-xgboost-{'-'.join(job.contenders)}")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
        .config("spark.sql.parquet.columnarReaderBatchSize", str(BATCH_ROWS))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def scored(frame: Any, job: XgbJob, contender: str) -> Any:
    """``frame``'s ``id`` and ``score``: the probability of class 1, as the contender computes it."""
    from pyspark.sql import functions as F

    if contender == "remote_predict":
        from udfserve.spark_client import ClientConfig, remote_predict

        config = ClientConfig(address=job.address, rows_per_request=BATCH_ROWS)
        return frame.select("id", remote_predict(MODEL, config=config)(INPUT).alias("score"))
    if contender == "predict_batch_udf":
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql.types import FloatType

        udf = predict_batch_udf(
            partial(booster_predict_fn, job.model_file),
            return_type=FloatType(),
            batch_size=BATCH_ROWS,
            input_tensor_shapes=[[job.features]],
        )
        return frame.select("id", udf(INPUT).alias("score"))
    if contender == "xgboost.spark":
        import xgboost
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from xgboost.spark import SparkXGBClassifier, SparkXGBClassifierModel

        classifier = xgboost.XGBClassifier()
        classifier.load_model(job.model_file)
        # The estimator's parameters (its defaults and the features column) copied onto a model of
        # this booster, as SparkXGBClassifier.fit does with the booster it trains.
        model = SparkXGBClassifier(features_col=INPUT)._copyValues(SparkXGBClassifierModel(classifier))
        transformed = model.transform(frame)
        probability = F.col("probability")
        if isinstance(transformed.schema["probability"].dataType, VectorUDT):
            probability = vector_to_array(probability)
        return transformed.select("id", probability[1].alias("score"))
    raise ValueError(f"unknown contender {contender!r}; expected one of {', '.join(CONTENDERS)}")


def _python_workers() -> Iterator[psutil.Process]:
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "pyspark.daemon" in command or "pyspark.worker" in command:
            yield child


def _jvm() -> Iterator[psutil.Process]:
    for child in psutil.Process().children(recursive=False):
        try:
            if "java" in child.name():
                yield child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def run_contender(spark: Any, job: XgbJob, contender: str) -> XgbJobResult:
    """``job.runs`` runs of one contender; the model server's CPU counts for ``remote_predict`` only."""
    frame = spark.read.parquet(job.data)
    rows = frame.count()
    predicted = scored(frame, job, contender)
    result = XgbJobResult(contender, rows, frame.rdd.getNumPartitions())
    serves = bool(job.server_pid) and contender == "remote_predict"
    server = PeakRssSampler(lambda: [psutil.Process(job.server_pid)] if serves else [], interval_s=0.2)
    jvm = PeakRssSampler(_jvm, interval_s=0.2)
    with PeakRssSampler(_python_workers) as workers, jvm, server:
        groups = {"Python workers": workers, "JVM": jvm, "model server": server}
        for _ in range(job.runs):
            before = {group: sampler.cpu_snapshot() for group, sampler in groups.items()}
            started = time.perf_counter()
            predicted.write.format("noop").mode("overwrite").save()
            result.runs_s.append(time.perf_counter() - started)
            result.runs_cpu_s.append({group: s.cpu_since(before[group]) for group, s in groups.items()})
        sample = predicted.where(f"id < {SAMPLE_ROWS}").collect()
    result.sample = {str(row["id"]): float(row["score"]) for row in sample}
    result.peak_worker_rss_total_mib = workers.peak_total_bytes / 2**20
    return result


def run_job(job: XgbJob) -> list[XgbJobResult]:
    spark = _session(job)
    results = [run_contender(spark, job, contender) for contender in job.contenders]
    spark.stop()
    return results


def run_in_child(job: XgbJob, timeout_s: float = 900.0) -> list[XgbJobResult]:
    """Run ``job`` in a fresh driver process; its JVM's output goes to ``job.log_file``."""
    output = run_json_child(
        "benchmarks.xgboost_job",
        asdict(job),
        job.log_file,
        f"Spark job {', '.join(job.contenders)} on {MODEL}",
        {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        timeout_s,
    )
    return [XgbJobResult(**result) for result in output["results"]]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    results = run_job(XgbJob(**json.loads(args[0])))
    print(json.dumps({"results": [asdict(result) for result in results]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
