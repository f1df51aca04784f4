"""The Spark client speaking KServe v2 to udfserve and to a real Triton: the Arrow path's answers.

    bash benchmarks/kserve/setup.sh          # once: Triton's own environment
    python -m benchmarks.kserve.interop      # about 2 minutes on 2 cores

A real Triton Inference Server (the one the ``nvidia-pytriton`` wheel bundles, CPU python
backend) serves ``tabular_mlp`` and ``sequence_bilstm`` from the same ``model.keras`` files as a
udfserve server of the example repository. One Spark application (``local[2]``) then predicts
the same DataFrame (an ``id`` and both models' inputs) five ways, for each model:

    (a) remote_predict, protocol="arrow", to udfserve           the reference
    (b) remote_predict, protocol="kserve", to udfserve's KServe endpoint (same port)
    (c) remote_predict, protocol="kserve", to Triton
    (d) predict_arrow (its mapInArrow function), protocol="kserve", to Triton
    (e) remote_predict, udf_type="arrow" (an Arrow UDF), protocol="kserve", to Triton

all with ``fallback="error"``, so that no row is quietly predicted on the CPU. Each path must
answer every id exactly once, within 1e-5 of (a); the UDF's own counters must show every row
answered by a server, and the server's own count (Triton's statistics, udfserve's
``udfserve_rows_total``) must have grown by the rows sent. Writes
``benchmarks/kserve/results/interop.{json,md}``; exits 1 when a comparison fails.

The Spark side runs in a child process (``--spark-job``): PySpark starts its Python workers
with the interpreter named by ``PYSPARK_PYTHON`` in the driver's environment, which the child
is given and this process keeps as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.kserve.run import DEFAULT_ENV_FILE, generate_examples, quiet_env, read_env_file, triton_server
from benchmarks.kserve.triton_model import EXAMPLE_MODELS, write_example_repository
from udfserve.services.model_server.launcher import launch_server

logger = logging.getLogger("benchmarks.kserve.interop")

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
TOLERANCE = 1e-5
SETUP_COMMAND = "bash benchmarks/kserve/setup.sh"
COMMAND = "python -m benchmarks.kserve.interop"
WARM_UP_ROWS = 1000
"""Rows each path predicts once, with a UDF of its own, before the measured action: the Python
workers, channels and ``tritonclient`` import are then paid for outside the measurement."""


@dataclass(frozen=True)
class Route:
    key: str
    api: str
    protocol: str
    server: str

    @property
    def label(self) -> str:
        api = "remote_predict, udf_type='arrow'" if self.api == "remote_predict_arrow" else self.api
        return f"({self.key}) {api}, protocol={self.protocol!r}, to {self.server}"


ROUTES = (
    Route("a", "remote_predict", "arrow", "udfserve"),
    Route("b", "remote_predict", "kserve", "udfserve"),
    Route("c", "remote_predict", "kserve", "triton"),
    Route("d", "predict_arrow", "kserve", "triton"),
    Route("e", "remote_predict_arrow", "kserve", "triton"),
)
REFERENCE = ROUTES[0]


@dataclass
class SparkJob:
    """What the child runs: where the data and the servers are, where its answers go."""

    data: str
    models: list[str]
    addresses: dict[str, str]
    """server name -> gRPC target (both protocols of udfserve on the same one)."""
    udfserve_http: str
    output_dir: str
    partitions: int
    repeats: int


@dataclass
class RouteRun:
    """One path over one model, as the Spark child saw it, summed over its repeats."""

    model: str
    route: str
    rows_in: int = 0
    rows_per_request: int = 0
    """What the UDF was built with: ``rows_per_request``, cut to the server's ``max_batch_size`` and to
    ``bytes_per_request``."""
    seconds: list[float] = field(default_factory=list)
    rows_by_server: int = 0
    rows_by_fallback: int = 0
    batches_by_server: int = 0
    retries: int = 0
    server_failures: dict[str, int] = field(default_factory=dict)
    rows_by_address: dict[str, int] = field(default_factory=dict)
    server_rows: float = 0.0
    """Rows the server itself counted during the actions (Triton's statistics, udfserve's metrics)."""
    server_requests: float = 0.0
    """Requests the server itself answered during the actions."""
    predictions: list[str] = field(default_factory=list)
    error: str = ""


@dataclass
class Comparison:
    """One path over one model against the reference path."""

    model: str
    route: str
    label: str
    rows: int
    repeats: int
    rows_per_request: int
    rows_per_s: float | None
    """Of the fastest repeat."""
    rows_per_s_all: list[float]
    missing_ids: int
    duplicate_ids: int
    max_abs_diff: float | None
    rows_by_server: int
    rows_by_fallback: int
    server_rows: float
    server_requests: float
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


# -- data --------------------------------------------------------------------------------------
def write_dataset(path: Path, models: Sequence[str], rows: int, files: int, seed: int = 11) -> None:
    """``rows`` rows of an ``id`` and each model's input as a flat ``array<float>``, in ``files`` files."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        count = min(per_file, rows - start)
        columns = {"id": pa.array(np.arange(start, start + count, dtype=np.int64))}
        for name in models:
            model = EXAMPLE_MODELS[name]
            width = int(np.prod(model.input_shape))
            values = pa.array(rng.standard_normal(count * width, dtype=np.float32))
            offsets = pa.array(np.arange(0, count * width + 1, width, dtype=np.int32))
            columns[model.input_name] = pa.ListArray.from_arrays(offsets, values)
        pq.write_table(pa.table(columns), path / f"part-{index:03d}.parquet")


# -- the Spark child ---------------------------------------------------------------------------
def server_counts(route: Route, model: str, job: SparkJob) -> tuple[float, float]:
    """Rows and requests the route's server has answered for ``model`` so far, by its own count."""
    if route.server == "triton":
        import tritonclient.grpc as triton

        with triton.InferenceServerClient(job.addresses["triton"]) as client:
            stats = client.get_inference_statistics(model).model_stats
        return (
            float(sum(s.inference_count for s in stats)),
            float(sum(s.inference_stats.success.count for s in stats)),
        )
    with urllib.request.urlopen(f"http://{job.udfserve_http}/metrics", timeout=10) as response:
        text = response.read().decode()
    ours = [line for line in text.splitlines() if f'model="{model}"' in line]
    return (
        sum(float(line.rsplit(" ", 1)[1]) for line in ours if line.startswith("udfserve_rows_total{")),
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in ours
            if line.startswith("udfserve_requests_total{") and 'code="OK"' in line
        ),
    )


def predicted(frame: Any, model: str, route: Route, job: SparkJob) -> tuple[Any, Any]:
    """``frame``'s ids with a ``prediction`` column through ``route``, and the object holding its counters."""
    from pyspark.sql.types import StructType

    from udfserve.spark_client import arrow_predictor, remote_predict

    column = EXAMPLE_MODELS[model].input_name
    settings: dict[str, Any] = {
        "address": job.addresses[route.server],
        "protocol": route.protocol,
        "fallback": "error",
    }
    frame = frame.select("id", column)
    if route.api in ("remote_predict", "remote_predict_arrow"):
        udf_type: Literal["pandas", "arrow"] = "arrow" if route.api == "remote_predict_arrow" else "pandas"
        udf = remote_predict(model, udf_type=udf_type, **settings)
        return frame.select("id", udf(column).alias("prediction")), udf
    # What predict_arrow(frame, model, [column], ["prediction"], ...) runs, kept for its counters.
    predictor = arrow_predictor(model, [column], ["prediction"], **settings)
    schema = StructType([*frame.schema.fields, *predictor.output_fields()])
    return frame.mapInArrow(predictor, schema).select("id", "prediction"), predictor


def warm_up(frame: Any, model: str, route: Route, job: SparkJob, run: RouteRun) -> None:
    try:
        result, _ = predicted(frame.where(f"id < {WARM_UP_ROWS}"), model, route, job)
        result.write.format("noop").mode("overwrite").save()
    except Exception as exc:  # the report names the failure of this path and the others still run
        fail(run, route, exc)


def measure(frame: Any, model: str, route: Route, job: SparkJob, run: RouteRun) -> None:
    """One action through ``route`` with a UDF of its own, added to ``run``."""
    try:
        result, counted = predicted(frame, model, route, job)
        rows_before, requests_before = server_counts(route, model, job)
        started = time.perf_counter()
        table = result.toArrow()
        seconds = time.perf_counter() - started
        rows_after, requests_after = server_counts(route, model, job)
        stats = counted.stats()
    except Exception as exc:  # the report names the failure of this path and the others still run
        fail(run, route, exc)
        return
    run.rows_per_request = counted.job.config.rows_per_request
    run.seconds.append(seconds)
    run.server_rows += rows_after - rows_before
    run.server_requests += requests_after - requests_before
    run.rows_by_server += stats.rows_by_server
    run.rows_by_fallback += stats.rows_by_fallback
    run.batches_by_server += stats.batches_by_server
    run.retries += stats.retries
    for mine, theirs in (
        (run.server_failures, stats.server_failures),
        (run.rows_by_address, stats.rows_by_address),
    ):
        for key, value in theirs.items():
            mine[key] = mine.get(key, 0) + value
    path = Path(job.output_dir) / f"{model}-{route.key}-{len(run.predictions)}.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    run.predictions.append(str(path))
    logger.info("%s on %s: %d rows in %.2f s", route.label, model, table.num_rows, seconds)


def fail(run: RouteRun, route: Route, exc: Exception) -> None:
    run.error = f"{type(exc).__name__}: {exc}"
    logger.error("%s on %s failed: %s", route.label, run.model, run.error[-2000:])


def in_turn(repeat: int) -> Sequence[Route]:
    """a b c d, then d c b a, ...: each path measured as early and as late as the others, so that
    load from outside falls on all alike."""
    return ROUTES if repeat % 2 == 0 else tuple(reversed(ROUTES))


def spark_session(partitions: int) -> Any:
    from pyspark.sql import SparkSession

    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-kserve-interop")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def spark_main(job: SparkJob) -> list[RouteRun]:
    spark = spark_session(job.partitions)
    try:
        frame = spark.read.parquet(job.data).repartition(job.partitions, "id").cache()
        rows = frame.count()
        runs: list[RouteRun] = []
        for model in job.models:
            by_route = {route.key: RouteRun(model, route.key, rows_in=rows) for route in ROUTES}
            for route in ROUTES:
                warm_up(frame, model, route, job, by_route[route.key])
            for repeat in range(job.repeats):
                for route in in_turn(repeat):
                    if not by_route[route.key].error:
                        measure(frame, model, route, job, by_route[route.key])
            runs.extend(by_route.values())
        return runs
    finally:
        spark.stop()


# -- comparison and report ---------------------------------------------------------------------
def read_predictions(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Ids and a (rows, width) float64 matrix of the predictions, sorted by id."""
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    ids = table.column("id").to_numpy()
    column = table.column("prediction").combine_chunks()
    width = len(column[0]) if len(column) else 0
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(column), width)
    order = np.argsort(ids, kind="stable")
    return ids[order], values[order]


def compare(run: RouteRun, reference: RouteRun, expected_ids: np.ndarray) -> Comparison:
    """Every repeat of ``run`` against the first answer of ``reference`` (itself included)."""
    route = next(r for r in ROUTES if r.key == run.route)
    failures: list[str] = [run.error] if run.error else []
    missing = duplicates = rows = 0
    differences: list[float] = []
    reference_answer = read_predictions(reference.predictions[0]) if reference.predictions else None
    if reference_answer is None and run.predictions:
        failures.append("nothing to compare with: path (a) gave no answer")
    for path in run.predictions:
        ids, values = read_predictions(path)
        rows = len(ids)
        unique = np.unique(ids)
        missing = max(missing, len(np.setdiff1d(expected_ids, unique)))
        duplicates = max(duplicates, rows - len(unique))
        if reference_answer is None or len(unique) != rows:
            continue
        ref_ids, ref_values = reference_answer
        if np.array_equal(ref_ids, ids) and ref_values.shape == values.shape:
            differences.append(float(np.max(np.abs(values - ref_values))) if rows else 0.0)
        else:
            failures.append(
                f"predictions of shape {values.shape} for ids not those of (a) {ref_values.shape}"
            )
    if missing or duplicates:
        failures.append(f"up to {missing} ids missing and {duplicates} duplicated among {rows} rows answered")
    max_abs_diff = max(differences) if differences else None
    if max_abs_diff is not None and not max_abs_diff <= TOLERANCE:
        failures.append(f"largest difference to (a) {max_abs_diff:.3e}; expected <= {TOLERANCE}")
    expected_rows = len(expected_ids) * len(run.predictions)
    if not run.error:
        if run.rows_by_fallback or run.rows_by_server != expected_rows:
            failures.append(
                f"client counters: {run.rows_by_server} rows by a server and {run.rows_by_fallback} by the "
                f"fallback over {len(run.predictions)} actions; expected {expected_rows} by a server"
            )
        if run.server_rows != expected_rows:
            failures.append(f"the server counted {run.server_rows:.0f} rows; expected {expected_rows}")
    return Comparison(
        model=run.model,
        route=run.route,
        label=route.label,
        rows=rows,
        repeats=len(run.predictions),
        rows_per_request=run.rows_per_request,
        rows_per_s=rows / min(run.seconds) if run.seconds and not run.error else None,
        rows_per_s_all=[round(rows / s, 1) for s in run.seconds],
        missing_ids=missing,
        duplicate_ids=duplicates,
        max_abs_diff=max_abs_diff,
        rows_by_server=run.rows_by_server,
        rows_by_fallback=run.rows_by_fallback,
        server_rows=run.server_rows,
        server_requests=run.server_requests,
        failures=failures,
    )


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write_report(
    comparisons: Sequence[Comparison], runs: Sequence[RouteRun], meta: dict[str, Any], output: Path
) -> None:
    output.mkdir(parents=True, exist_ok=True)
    record = {
        "meta": meta,
        "passed": all(c.passed for c in comparisons),
        "comparisons": [{**asdict(c), "passed": c.passed} for c in comparisons],
        "runs": [{k: v for k, v in asdict(r).items() if k != "predictions"} for r in runs],
    }
    (output / "interop.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# The Spark client over KServe v2: udfserve and a real Triton against the Arrow path",
        "",
        f"One Spark application (`local[2]`, {meta['partitions']} partitions) predicts the same "
        f"{meta['rows']:,} rows (an `id` and each model's input as a flat `array<float>`) "
        f"{len(ROUTES)} ways, with "
        '`fallback="error"`. Triton '
        f"{meta['triton_version']} (the `nvidia-pytriton` {meta['pytriton_version']} wheel's server, python "
        "backend on the CPU) serves the same `model.keras` files as udfserve, with the same `max_batch_size` "
        "and batching delay, through one `tf.function`. "
        f"Set-up: `{SETUP_COMMAND}`; command: `{COMMAND}`.",
        "",
        f"Each path runs {meta['repeats']} actions (`toArrow()` of the ids and predictions), each with a "
        f"UDF of its own, in turns (a b c d, d c b a, ...), after a warm-up of {WARM_UP_ROWS:,} rows per "
        f"path. A path passes when every action answers every id exactly once, within {TOLERANCE:g} of "
        "(a)'s first answer ((a)'s own row compares its later actions with its first), the UDFs' "
        "counters (`.stats()`) give every row to a server and none to the "
        "fallback, and the server's own count (Triton's inference statistics, udfserve's "
        "`udfserve_rows_total`) grew by the rows sent. Rows per request: `rows_per_request` (4,096), cut "
        "by the client to the `max_batch_size` of the server's `ModelConfig` on the KServe paths and to "
        "`bytes_per_request` (2 MiB of input: 1,024 rows of `sequence_bilstm`) on every path; the "
        "server's requests are those it counted (Triton's successful requests, udfserve's "
        '`udfserve_requests_total{code="OK"}`). rows/s: the fastest action (all of them in the JSON), '
        f"on a {meta['cpus']}-CPU machine shared with other work (load average "
        f"{meta['load_average_1m_before']} before, {meta['load_average_1m_after']} after): a comparison of "
        "paths, not a measurement of servers.",
        "",
        "| model | path | rows x actions | rows per request | missing / duplicated ids | max abs diff to (a) "
        "| rows by server / fallback | rows / requests counted by the server | rows/s | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.model} | {c.label} | {c.rows:,} x {c.repeats} | {c.rows_per_request:,} "
            f"| {c.missing_ids} / {c.duplicate_ids} | {fmt(c.max_abs_diff, '.2e')} "
            f"| {c.rows_by_server:,} / {c.rows_by_fallback:,} "
            f"| {c.server_rows:,.0f} / {c.server_requests:,.0f} "
            f"| {fmt(c.rows_per_s, ',.0f')} | {'pass' if c.passed else '**FAIL**'} |"
        )
    failed = [c for c in comparisons if not c.passed]
    if failed:
        lines += ["", "Failures:", ""]
        lines += [f"- {c.model} {c.label}: {'; '.join(f[-1500:] for f in c.failures)}" for c in failed]
    (output / "interop.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


# -- servers and main --------------------------------------------------------------------------
@contextmanager
def udfserve_server(repository: Path, models: Sequence[str], logs: Path) -> Iterator[tuple[str, str]]:
    """The gRPC target (Arrow and KServe v2) and the HTTP address of a udfserve server."""
    process = launch_server(
        repository,
        port=0,
        http_port=0,
        extra_args=["--models", ",".join(models)],
        env=quiet_env(),
        log_path=logs / "udfserve.log",
    )
    try:
        if process.tcp_address is None or process.http_address is None:
            raise RuntimeError(f"udfserve reported addresses {process.addresses}; expected TCP and HTTP")
        yield process.tcp_address, process.http_address
    finally:
        process.terminate()


def triton_metadata(address: str, models: Sequence[str]) -> str:
    """Triton's version, once every model is ready (Triton loads them all before it listens)."""
    import tritonclient.grpc as triton

    with triton.InferenceServerClient(address) as client:
        not_ready = [m for m in models if not client.is_model_ready(m)]
        if not_ready:
            raise RuntimeError(f"Triton at {address} does not serve {not_ready}; expected {list(models)}")
        return str(client.get_server_metadata().version)


def run_spark_child(job: SparkJob, work: Path, timeout_s: float) -> list[RouteRun]:
    job_file, result_file, log_file = work / "spark-job.json", work / "spark-result.json", work / "spark.log"
    job_file.write_text(json.dumps(asdict(job)), encoding="utf-8")
    with open(log_file, "wb") as log:
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.kserve.interop",
                "--spark-job",
                str(job_file),
                str(result_file),
            ],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=quiet_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}),
            timeout=timeout_s,
            check=False,
        )
    if completed.returncode != 0 or not result_file.exists():
        tail = log_file.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the Spark job exited with {completed.returncode}; log tail:\n{tail}")
    return [RouteRun(**run) for run in json.loads(result_file.read_text())]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", type=Path, default=DEFAULT_ENV_FILE, help="written by setup.sh")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="measured actions per path and model")
    parser.add_argument("--models", default="tabular_mlp,sequence_bilstm", help="comma-separated")
    parser.add_argument("--output", type=Path, default=HERE / "results")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="longest wait for the Spark job")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, answers)")
    parser.add_argument("--spark-job", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    if args.spark_job:
        job = SparkJob(**json.loads(Path(args.spark_job[0]).read_text()))
        runs = spark_main(job)
        Path(args.spark_job[1]).write_text(json.dumps([asdict(r) for r in runs]), encoding="utf-8")
        return 0
    env_file = read_env_file(args.env_file)
    models = args.models.split(",")
    work = Path(tempfile.mkdtemp(prefix="udfsk-interop-"))
    try:
        repository = generate_examples(work / "udfserve-repo")
        triton_repo = write_example_repository(
            work / "triton-repo", repository, env_file["TRITON_SITE_PACKAGES"], models
        )
        data = work / "data"
        write_dataset(data, models, args.rows, files=args.partitions)
        meta: dict[str, Any] = {
            "rows": args.rows,
            "partitions": args.partitions,
            "repeats": args.repeats,
            "models": models,
            "cpus": os.cpu_count(),
            "tolerance": TOLERANCE,
            "setup_command": SETUP_COMMAND,
            "command": COMMAND,
            "pytriton_version": pytriton_version(env_file),
            "load_average_1m_before": round(os.getloadavg()[0], 2),
        }
        with ExitStack() as stack:
            udfserve_address, udfserve_http = stack.enter_context(udfserve_server(repository, models, work))
            triton_address = stack.enter_context(triton_server(triton_repo, env_file, work))[0]["grpc"]
            meta["triton_version"] = triton_metadata(triton_address, models)
            logger.info(
                "udfserve at %s, Triton %s at %s", udfserve_address, meta["triton_version"], triton_address
            )
            job = SparkJob(
                data=str(data),
                models=models,
                addresses={"udfserve": udfserve_address, "triton": triton_address},
                udfserve_http=udfserve_http,
                output_dir=str(work),
                partitions=args.partitions,
                repeats=args.repeats,
            )
            runs = run_spark_child(job, work, args.timeout_s)
        meta["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        expected_ids = np.arange(args.rows, dtype=np.int64)
        comparisons = []
        for model in models:
            reference = next(r for r in runs if r.model == model and r.route == REFERENCE.key)
            for run in (r for r in runs if r.model == model):
                comparisons.append(compare(run, reference, expected_ids))
        write_report(comparisons, runs, meta, args.output)
        for c in comparisons:
            logger.info(
                "%s %s: %s, max abs diff %s, %s rows/s",
                c.model,
                c.label,
                "pass" if c.passed else "FAIL: " + "; ".join(c.failures)[-1500:],
                fmt(c.max_abs_diff, ".2e"),
                fmt(c.rows_per_s, ",.0f"),
            )
        logger.info("wrote %s", args.output / "interop.md")
        return 0 if all(c.passed for c in comparisons) else 1
    finally:
        if args.keep:
            logger.info("scratch folder kept: %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def pytriton_version(env_file: dict[str, str]) -> str:
    """The version of the wheel whose tritonserver runs, from its installed metadata."""
    site = Path(env_file["TRITON_SITE_PACKAGES"])
    found = sorted(site.glob("nvidia_pytriton-*.dist-info"))
    return found[-1].name.removeprefix("nvidia_pytriton-").removesuffix(".dist-info") if found else "unknown"


if __name__ == "__main__":
    sys.exit(main())
