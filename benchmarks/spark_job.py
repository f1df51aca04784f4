"""One Spark application running one contender of the Spark comparisons, in its own process.

Each contender gets a fresh driver, JVM and Python workers, so that no worker carries
TensorFlow or a cached model from another contender, and the resident memory of its workers is
its own. The parent passes a JSON job on the command line and reads one JSON line of results:

    python -m benchmarks.spark_job '{"contender": "remote_predict", "model": "tabular_mlp", ...}'

Contenders: ``remote_predict`` and ``predict_arrow`` (through a model server),
``predict_files`` (the same server, the files read by pyarrow in the Python workers instead of
Spark's reader), ``predict_batch_udf`` (Spark's own, model in the worker), ``cached_pandas_udf``
(model cached once per worker), ``load_per_batch`` (the model loaded for every batch),
``passthrough`` (a pandas UDF that returns its input's first values without a model: the ceiling
of any pandas UDF here) and ``passthrough_arrow`` (the same through ``mapInArrow``: the ceiling
of any Arrow UDF here).

With ``Job.long_passes``, the application also measures the contender's steady rate, as Ray
Data's is measured (``benchmarks.steady_rate``): its jobs alternate one pass over the files with
``long_passes`` passes in one job, and the long job's extra rows over its extra time leave out
Spark's fixed costs of a job (planning it, scheduling its tasks, the JVM's work per job).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.processes import PeakRssSampler
from benchmarks.steady_rate import SteadyPair, long_folder, steady_runs

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_ROWS = 64

MODELS = {
    # model -> (input column, flat values per row, output name, output width)
    "tabular_mlp": ("features", 64, "probabilities", 8),
    # its exports, served by the ONNX Runtime and PyTorch backends (benchmarks.backends)
    "tabular_mlp_onnx": ("features", 64, "probabilities", 8),
    "tabular_mlp_torch": ("features", 64, "probabilities", 8),
    "sequence_bilstm": ("lines", 16 * 32, "class_probabilities", 4),
}

REMOTE = ("remote_predict", "remote_predict_arrow", "predict_arrow", "predict_files")
IN_WORKER = ("predict_batch_udf", "cached_pandas_udf", "load_per_batch")
MODEL_LESS = ("passthrough", "passthrough_arrow")
CONTENDERS = (*REMOTE, *IN_WORKER, *MODEL_LESS)
READS_ITS_FILES = ("predict_files",)
"""Contenders whose rows come from their own reads of the files, not from Spark's reader."""


@dataclass
class Job:
    contender: str
    model: str
    data: str | None = None
    """A parquet folder; None: ``synthetic_rows`` rows made by Spark in ``partitions`` tasks."""
    synthetic_rows: int = 0
    partitions: int = 0
    model_file: str = ""
    address: str = ""
    server_pid: int = 0
    """The model server's process, whose CPU time counts for the remote contenders."""
    marker_dir: str = ""
    runs: int = 1
    warmup_rows: int = 0
    """0: none; else the rows with ``id`` below this go through the contender once, untimed, before
    the runs: that run pays the workers' start, TensorFlow's import and the model's load, so the
    first timed run of a large job is as warm as a later one (``benchmarks.scaling``)."""
    batch_rows: int = 16384
    rows_per_request: int = 4096
    bytes_per_request: int = 0
    """0: the client's default."""
    predict_batch_size: int = 4096
    log_file: str = ""
    client_settings: dict[str, Any] = field(default_factory=dict)
    """More ``ClientConfig`` fields of the remote contenders (``address`` empty: found through
    the node's discovery file)."""
    start_gate: str = ""
    """A file path: once warm (after the untimed run), the application writes ``<start_gate>.<pid>.ready``
    and waits for ``start_gate`` to exist before its timed runs, so that several applications' jobs
    start together (``benchmarks.fairness``); "" (default): no wait."""
    long_passes: int = 0
    """0: none; else a long job, over ``data``'s files this many times over (hard links in a folder
    beside ``data``: ``steady_rate.long_folder``), runs between each two of the ``runs`` jobs over
    ``data``: short, long, short, ..., short (``runs`` short jobs, ``runs - 1`` long ones; the first
    short job runs cold). ``JobResult.steady_rows_s`` compares the two kinds."""

    def __post_init__(self) -> None:
        if not self.long_passes:
            return
        if self.data is None:
            raise ValueError(
                f"{self.contender}: long_passes={self.long_passes} repeats the files of `data`, which is "
                "not set; expected a parquet folder"
            )
        if self.long_passes < 2 or self.runs < 2:
            raise ValueError(
                f"{self.contender}: long_passes={self.long_passes} with runs={self.runs}; expected "
                "long_passes >= 2 and runs >= 2 (a long job runs between two short ones)"
            )


@dataclass
class JobResult:
    contender: str
    model: str
    rows: int
    partitions: int
    runs_s: list[float] = field(default_factory=list)
    peak_worker_rss_total_mib: float = 0.0
    peak_worker_rss_single_mib: float = 0.0
    peak_worker_pss_total_mib: float = 0.0
    """The proportional set size of all Python workers at their peak (sampled every 0.25 s): each
    page the daemon shares with the workers it forked counted once."""
    python_workers_seen: int = 0
    peak_jvm_rss_mib: float = 0.0
    model_loads_in_workers: int = 0
    runs_cpu_s: list[dict[str, float]] = field(default_factory=list)
    """CPU seconds of each run by process group: Python workers, JVM, model server."""

    @property
    def best_run(self) -> int:
        """The fastest run after the first (which pays the workers' start), or the only one: the
        run least disturbed by other work on the machine."""
        candidates = range(1, len(self.runs_s)) if len(self.runs_s) > 1 else range(len(self.runs_s))
        return min(candidates, key=lambda index: self.runs_s[index])

    sample: dict[str, list[float]] = field(default_factory=dict)
    rounds_rows_s: list[float] = field(default_factory=list)
    """The rows/s (per job) of each round's application, where several ran (``spark_e2e.best_of``)."""
    warmup_s: float = 0.0
    """How long the untimed run of ``Job.warmup_rows`` rows took (0: none ran)."""
    long_rows: int = 0
    """The rows of a long job (``Job.long_passes`` times ``rows``; 0: no long jobs ran)."""
    long_runs_s: list[float] = field(default_factory=list)
    long_runs_cpu_s: list[dict[str, float]] = field(default_factory=list)
    """The long jobs' wall and CPU seconds, as ``runs_s`` and ``runs_cpu_s`` are the short ones'."""
    steady_rows_s: float = 0.0
    """rows/s with every fixed cost of a job left out: the long job's extra rows over its extra
    time (the fastest of each kind after the first); 0 where not measured (``measure_steady``)."""
    steady_cpu_s_per_million_rows: dict[str, float] = field(default_factory=dict)
    """CPU seconds per million rows at the steady rate by process group: the long job's CPU less
    the short job's, over the extra rows; empty where the steady rate was not measured."""
    rounds_steady_rows_s: list[float] = field(default_factory=list)
    """The steady rows/s of each round's application, where several ran (``spark_e2e.best_of``)."""

    def steady_pair(self) -> SteadyPair | None:
        """The short and the long run the steady rate compares (``steady_rate.steady_runs``)."""
        chosen = steady_runs(self.runs_s, self.long_runs_s)
        if chosen is None:
            return None
        short, long = chosen
        return SteadyPair(
            self.runs_s[short],
            self.long_runs_s[long],
            self.long_rows - self.rows,
            self.runs_cpu_s[short],
            self.long_runs_cpu_s[long],
        )

    def measure_steady(self) -> None:
        """Set ``steady_rows_s`` and ``steady_cpu_s_per_million_rows`` from the runs."""
        pair = self.steady_pair()
        self.steady_rows_s = pair.rows_s if pair else 0.0
        self.steady_cpu_s_per_million_rows = pair.cpu_s_per_million_rows() if pair and pair.rows_s else {}


def write_dataset(path: Path, model: str, rows: int, files: int, seed: int = 0) -> None:
    """``rows`` rows of an ``id`` and the model's input as a flat ``array<float>``, in ``files`` files."""
    column, width, _, _ = MODELS[model]
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        count = min(per_file, rows - start)
        values = rng.standard_normal(count * width, dtype=np.float32)
        offsets = np.arange(0, count * width + 1, width, dtype=np.int32)
        table = pa.table(
            {
                "id": pa.array(np.arange(start, start + count, dtype=np.int64)),
                column: pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        pq.write_table(table, path / f"part-{index:03d}.parquet", row_group_size=16384)


def _is_python_worker(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "pyspark.daemon" in command or "pyspark.worker" in command


def _python_workers() -> Iterator[psutil.Process]:
    for child in psutil.Process().children(recursive=True):
        if _is_python_worker(child):
            yield child


def _jvm() -> Iterator[psutil.Process]:
    for child in psutil.Process().children(recursive=False):
        try:
            if "java" in child.name():
                yield child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def _session(job: Job) -> Any:
    from pyspark.sql import SparkSession

    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"udfserve-bench-{job.contender}")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(job.batch_rows))
        .config("spark.sql.parquet.columnarReaderBatchSize", str(job.batch_rows))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _input_frame(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    column, width, _, _ = MODELS[job.model]
    if job.data is not None:
        return spark.read.parquet(job.data)
    values = [F.randn(seed=i).cast("float") for i in range(width)]
    return spark.range(0, job.synthetic_rows, 1, job.partitions).select(
        F.col("id"), F.array(*values).alias(column)
    )


def _client_config(job: Job) -> Any:
    """The remote contenders' client settings: the defaults but for what the job sets."""
    from udfserve.spark_client import ClientConfig

    size = {"bytes_per_request": job.bytes_per_request} if job.bytes_per_request else {}
    address = {"address": job.address} if job.address else {}
    return ClientConfig.model_validate(
        {**address, "rows_per_request": job.rows_per_request, **size, **job.client_settings}
    )


def _predicted(spark: Any, frame: Any, job: Job) -> Any:
    """``frame`` with a ``prediction`` column (an ``array<float>``) computed by the contender."""
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType

    column, width, _, output_width = MODELS[job.model]
    result_type = ArrayType(FloatType())
    if job.contender in ("remote_predict", "remote_predict_arrow"):
        from udfserve.spark_client import remote_predict

        udf_type: Literal["pandas", "arrow"] = (
            "arrow" if job.contender == "remote_predict_arrow" else "pandas"
        )
        udf = remote_predict(job.model, udf_type=udf_type, config=_client_config(job))
        return frame.withColumn("prediction", udf(column))
    if job.contender == "predict_arrow":
        from udfserve.spark_client import predict_arrow

        return predict_arrow(
            frame,
            job.model,
            [column],
            ["prediction"],
            config=_client_config(job),
        )
    if job.contender == "predict_files":
        from udfserve.spark_client import predict_files

        if job.data is None:
            raise ValueError("predict_files reads parquet files: `data` is not set; expected a folder")
        return predict_files(
            job.data,
            job.model,
            input_columns=[column],
            output_columns=["prediction"],
            keep_columns=["id"],
            config=_client_config(job),
            read_batch_rows=job.batch_rows,
            spark=spark,
        )
    if job.contender == "passthrough_arrow":
        from pyspark.sql.types import StructField, StructType

        from benchmarks.arrow_passthrough import first_values_batches

        # A new StructType: ``add`` would change the frame's own cached schema in place.
        schema = StructType([*frame.schema.fields, StructField("prediction", result_type)])
        return frame.mapInArrow(first_values_batches(column, output_width), schema)
    from benchmarks import inworker

    if job.contender == "predict_batch_udf":
        from functools import partial

        from pyspark.ml.functions import predict_batch_udf

        udf = predict_batch_udf(
            partial(inworker.make_batch_udf_predict_fn, job.model_file, job.marker_dir),
            return_type=result_type,
            batch_size=job.predict_batch_size,
            input_tensor_shapes=[[width]],
        )
        return frame.withColumn("prediction", udf(column))
    # The recipes' functions are built by factories, so PySpark's stubs cannot see the pandas
    # type hints that pick pandas_udf's overload (Spark reads them at run time).
    recipes: dict[str, Any] = {
        "cached_pandas_udf": lambda: inworker.cached_pandas_udf(job.model_file, job.marker_dir),
        "load_per_batch": lambda: inworker.load_per_batch_pandas_udf(job.model_file, job.marker_dir),
        "passthrough": lambda: inworker.passthrough_pandas_udf(output_width),
    }
    if job.contender in recipes:
        udf = pandas_udf(recipes[job.contender](), returnType=result_type)  # type: ignore[call-overload]
        return frame.withColumn("prediction", udf(column))
    raise ValueError(f"unknown contender {job.contender!r}; expected one of {', '.join(CONTENDERS)}")


def _check_every_id(predicted: Any, contender: str, rows: int, times: int) -> None:
    """A contender that reads its files itself must answer every id of them ``times`` times."""
    from pyspark.sql import functions as F

    counted = (
        predicted.groupBy("id")
        .count()
        .agg(F.count("*").alias("ids"), F.min("count").alias("least"), F.max("count").alias("most"))
        .first()
    )
    if not counted["ids"] == rows or not counted["least"] == counted["most"] == times:
        raise RuntimeError(
            f"{contender}: {counted['ids']} distinct ids came back, each {counted['least']} to "
            f"{counted['most']} times; expected {rows} ids, each {times} time(s)"
        )


def run_job(job: Job) -> JobResult:
    spark = _session(job)
    frame = _input_frame(spark, job)
    rows = frame.count()
    predicted = _predicted(spark, frame, job)
    long_predicted, long_rows = None, 0
    if job.long_passes:
        long_job = replace(job, data=str(long_folder(Path(str(job.data)), job.long_passes)))
        long_frame = _input_frame(spark, long_job)
        long_rows = long_frame.count()
        long_predicted = _predicted(spark, long_frame, long_job)
    # A contender that reads its files has its own tasks, not the partitions of Spark's reader.
    tasks = predicted if job.contender in READS_ITS_FILES else frame
    result = JobResult(job.contender, job.model, rows, tasks.rdd.getNumPartitions())
    result.long_rows = long_rows
    jvm_peak = PeakRssSampler(_jvm, interval_s=0.2)
    server = PeakRssSampler(
        lambda: [psutil.Process(job.server_pid)] if job.server_pid else [], interval_s=0.2
    )
    with PeakRssSampler(_python_workers, pss_every=5) as workers, jvm_peak, server:
        groups = {"Python workers": workers, "JVM": jvm_peak, "model server": server}

        def timed(job_frame: Any) -> tuple[float, dict[str, float]]:
            before = {group: sampler.cpu_snapshot() for group, sampler in groups.items()}
            started = time.perf_counter()
            job_frame.write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
            return seconds, {group: sampler.cpu_since(before[group]) for group, sampler in groups.items()}

        if job.warmup_rows:
            # The filter on ``id`` runs below the UDF (Spark pushes it down), and the same UDF
            # object keeps the model ``predict_batch_udf`` cached in its workers for the runs.
            started = time.perf_counter()
            predicted.where(f"id < {job.warmup_rows}").write.format("noop").mode("overwrite").save()
            result.warmup_s = time.perf_counter() - started
        if job.start_gate:
            _wait_at_the_gate(Path(job.start_gate))
        for run in range(job.runs):
            if run and long_predicted is not None:
                # The peaks are those of the jobs every contender runs: the in-worker and
                # model-less ones, the memory floors included, run no long jobs.
                with workers.peaks_paused(), jvm_peak.peaks_paused(), server.peaks_paused():
                    seconds, cpu_s = timed(long_predicted)
                result.long_runs_s.append(seconds)
                result.long_runs_cpu_s.append(cpu_s)
            seconds, cpu_s = timed(predicted)
            result.runs_s.append(seconds)
            result.runs_cpu_s.append(cpu_s)
        if job.contender in READS_ITS_FILES:
            # Its rows come from its own reads, not from ``frame``: every id back as often as read.
            _check_every_id(predicted, job.contender, rows, 1)
            if long_predicted is not None:
                _check_every_id(long_predicted, job.contender, rows, job.long_passes)
        sample = predicted.where(f"id < {SAMPLE_ROWS}").select("id", "prediction").collect()
    result.sample = {str(row["id"]): [float(v) for v in row["prediction"]] for row in sample}
    result.peak_worker_rss_total_mib = workers.peak_total_bytes / 2**20
    result.peak_worker_rss_single_mib = workers.peak_single_bytes / 2**20
    result.peak_worker_pss_total_mib = workers.peak_pss_total_bytes / 2**20
    result.python_workers_seen = len(workers.pids_seen)
    result.peak_jvm_rss_mib = jvm_peak.peak_total_bytes / 2**20
    result.measure_steady()
    if job.marker_dir and Path(job.marker_dir).is_dir():
        result.model_loads_in_workers = sum(1 for _ in Path(job.marker_dir).iterdir())
    spark.stop()
    return result


GATE_WAIT_S = 900.0


def _wait_at_the_gate(gate: Path) -> None:
    """Say this application is ready, then wait for the parent to open the gate."""
    gate.with_name(f"{gate.name}.{os.getpid()}.ready").touch()
    deadline = time.monotonic() + GATE_WAIT_S
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the start gate {gate} was not opened within {GATE_WAIT_S:.0f} s")
        time.sleep(0.05)  # a look at a file the parent creates


def run_in_child(job: Job, timeout_s: float = 900.0) -> JobResult:
    """Run ``job`` in a fresh driver process; its JVM's output goes to ``job.log_file``."""
    from benchmarks.processes import run_json_child

    output = run_json_child(
        "benchmarks.spark_job",
        asdict(job),
        job.log_file,
        f"Spark job {job.contender} on {job.model}",
        {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        timeout_s,
    )
    return JobResult(**output)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    job = Job(**json.loads(args[0]))
    result = run_job(job)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
