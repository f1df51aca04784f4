"""Probe: where a Spark Python worker's resident memory goes, ``remote_predict``'s pandas UDF
against a pandas UDF without a model (its floor), in interleaved Spark applications.

    python -m benchmarks.worker_memory [--rows 300000] [--rounds 2] [--variants floor,remote_predict]
                                       [--baseline DIR]

Each variant runs as its own Spark application (local[2], a fresh JVM, daemon and workers) over
the same parquet files of the tabular model's input, against one ``udfserve serve``. While it
runs, each Python worker's ``/proc/<pid>/smaps`` is read whenever its resident size reaches a new
high, so the breakdown printed is the one at its peak; at the end of each partition the worker
also reports from inside (its high-water mark, glibc's and pyarrow's allocators, the packages it
imported).

Variants: ``floor``, the model-less pandas UDF of ``benchmarks.spark_e2e``; ``floor + client
loaded``, the same function carrying ``remote_predict``'s job and importing its worker modules,
sending nothing (what loading the client costs, apart from using it); ``floor + pydantic
models``, the floor importing only pydantic and ``ClientConfig`` (what a task saves now that its
path imports neither: the job carries a plain ``TaskConfig``); ``remote_predict``, its pandas
UDF's own function; and variants of it under other settings. ``--baseline DIR`` adds
``remote_predict`` with the client of another checkout (``DIR``: a checkout such as a ``git
worktree`` of an earlier commit, or a tree of links made from one by ``scripts/source_tree.py``),
for before/after figures in the same run: its driver and workers import that checkout's
``udfserve`` and nothing of this one's (``benchmarks.client_trees``; the same Python and
packages). Every process of a variant reports where its ``udfserve`` came from, and the run stops
without a table when a variant's client is not the checkout it names. Memory only: no rate is
printed, as the runs are too short and too few to time.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

import psutil

from benchmarks.cli import configure_logging
from benchmarks.client_trees import WrongTreeError, baseline_checkout, baseline_path, check_trees
from benchmarks.processes import LOGS_DIR, PeakRssSampler, Workspace, child_env
from benchmarks.spark_job import MODELS, REPO_ROOT, _python_workers, write_dataset
from benchmarks.worker_smaps import breakdown, status_mib, udfserve_files

logger = logging.getLogger(__name__)

MODEL = "tabular_mlp"
VARIANTS: dict[str, dict[str, Any]] = {
    "floor": {"remote": False},
    "floor + client loaded": {"remote": False, "client": True},
    # pydantic and ClientConfig alone: what a task saves now that its path imports neither
    "floor + pydantic models": {"remote": False, "imports": ("udfserve.spark_client.common.config",)},
    "remote_predict": {"remote": True},
    "remote_predict max_in_flight=1": {"remote": True, "config": {"max_in_flight": 1}},
    "remote_predict rows_per_request=1024": {"remote": True, "config": {"rows_per_request": 1024}},
    "remote_predict no shared memory": {"remote": True, "config": {"shared_memory": False}},
    "floor system_allocator": {"remote": False, "env": {"ARROW_DEFAULT_MEMORY_POOL": "system"}},
    "remote_predict system_allocator": {"remote": True, "env": {"ARROW_DEFAULT_MEMORY_POOL": "system"}},
}
BASELINE = "remote_predict (baseline)"
SHOWN = (
    *("rss", "anonymous", "heap (brk)", "pyarrow", "pandas", "numpy", "grpc", "pydantic_core", "pyspark"),
    *("python", "shared-memory files", "other packages", "other files", "anonymous pages"),
)


# -- in the child: one Spark application ---------------------------------------------------------
def _session(python_path: str, executor_env: dict[str, str], batch_rows: int) -> Any:
    """The variant's Spark session: its Python workers import from ``python_path`` only, not from
    the folder Spark starts them in (``python -m pyspark.daemon`` would put it first)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-worker-memory")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.executorEnv.PYTHONSAFEPATH", "1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
        .config("spark.sql.parquet.columnarReaderBatchSize", str(batch_rows))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
    )
    for key, value in executor_env.items():
        builder = builder.config(f"spark.executorEnv.{key}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _first_values(width: int, job: Any = None, imports: Sequence[str] = ()) -> Any:
    """The floor: the first ``width`` values of each row, through the conversions of a pandas
    UDF over arrays (``benchmarks.inworker.passthrough_pandas_udf``), in the iterator form.

    ``job``: a ``PredictJob`` the function carries to the worker, which also imports what
    ``remote_predict``'s function imports there, and sends nothing: the client loaded, unused.
    ``imports``: modules the worker imports before its first batch (a part of the client alone).
    """
    from collections.abc import Iterator

    from benchmarks.inworker import passthrough_pandas_udf

    first_values = passthrough_pandas_udf(width)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import importlib

        for module in imports:
            importlib.import_module(module)
        if job is not None:
            import udfserve.spark_client.executor.pandas_udf
            import udfserve.spark_client.executor.task
            import udfserve.spark_client.wire.protocols  # noqa: F401
        for series in batches:
            yield first_values(series)

    return run


class _PeakSmaps:
    """Each Python worker's ``smaps`` breakdown at its highest resident size, read in a thread."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.peaks: dict[int, dict[str, Any]] = {}
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smaps-sampler", daemon=True)

    def __enter__(self) -> _PeakSmaps:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for process in _python_workers():
                try:
                    rss = status_mib(process.pid)["VmRSS"]
                    if rss > self.peaks.get(process.pid, {}).get("rss", 0.0) + 1.0:
                        parent = process.parent()
                        forked = parent is not None and "pyspark.daemon" in " ".join(parent.cmdline())
                        # The daemon's forks keep its command line: a worker is a child of the daemon.
                        role = "worker" if forked else "daemon"
                        self.peaks[process.pid] = {"role": role, **breakdown(process.pid)}
                except (OSError, KeyError, psutil.Error):  # a worker may exit mid-read
                    continue


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One variant's application: its workers' peaks and their reports, as JSON-able data. Its
    path (``PYTHONPATH``, set by the parent) already names the checkout whose client it runs."""
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType

    from benchmarks.worker_smaps import reported

    column, _, _, output_width = MODELS[MODEL]
    spark = _session(spec["python_path"], spec["env"], spec["batch_rows"])
    frame = spark.read.parquet(spec["data"])
    job = None
    if spec["remote"] or spec["client"]:
        from udfserve.spark_client import ClientConfig, remote_predict

        config = ClientConfig.model_validate({"address": spec["address"], **spec["config"]})
        job = remote_predict(MODEL, config=config).job
    if spec["remote"] and job is not None:
        from udfserve.spark_client.executor.pandas_udf import pandas_function

        function = pandas_function(job, False)
    else:
        function = _first_values(output_width, job, spec["imports"])
    udf = pandas_udf(reported(function, spec["report_dir"]), returnType=ArrayType(FloatType()))  # type: ignore[call-overload]
    predicted = frame.withColumn("prediction", udf(column))
    from benchmarks.spark_job import _python_workers as workers

    with PeakRssSampler(workers, interval_s=0.05) as total, _PeakSmaps() as peaks:
        for _ in range(spec["runs"]):
            predicted.write.format("noop").mode("overwrite").save()
    spark.stop()
    reports = [json.loads(p.read_text()) for p in sorted(Path(spec["report_dir"]).glob("*.json"))]
    return {
        "peak_total_mib": total.peak_total_bytes / 2**20,
        "peaks": list(peaks.peaks.values()),
        "reports": reports,
        "driver udfserve files": udfserve_files(),
    }


# -- in the parent: the variants, interleaved ----------------------------------------------------
def _run_variant(
    name: str,
    data: Path,
    address: str,
    args: argparse.Namespace,
    scratch: Path,
    trees: dict[str, tuple[Path, str]],
) -> dict[str, Any]:
    """One application of variant ``name``, in a child on the path of the checkout it runs
    (``trees``: name -> checkout, ``PYTHONPATH``; the baseline's for ``BASELINE``, this one's
    otherwise); ``WrongTreeError`` if its driver or a worker imported another's ``udfserve``."""
    variant = VARIANTS.get(name, {"remote": True})
    tree = "baseline" if name == BASELINE else "current"
    python_path = trees[tree][1]
    report_dir = Path(tempfile.mkdtemp(prefix="reports-", dir=scratch))
    spec = {
        "remote": variant["remote"],
        "client": variant.get("client", False),
        "imports": variant.get("imports", ()),
        "config": variant.get("config", {}),
        "env": variant.get("env", {}),
        "python_path": python_path,
        "data": str(data),
        "address": address,
        "report_dir": str(report_dir),
        "batch_rows": args.batch_rows,
        "runs": args.runs,
    }
    log = LOGS_DIR / "worker-memory.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as stderr:
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.worker_memory", "--child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=child_env(
                {
                    "PYSPARK_PYTHON": sys.executable,
                    "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "PYTHONPATH": python_path,
                    "PYTHONSAFEPATH": "1",
                }
            ),
            check=False,
        )
    if completed.returncode != 0:
        raise RuntimeError(f"variant {name!r} failed with exit code {completed.returncode}; see {log}")
    result = dict(json.loads(completed.stdout.decode().strip().splitlines()[-1]))
    imports = [("driver", result["driver udfserve files"])]
    imports += [(f"Spark worker {r['pid']}", r["udfserve files"]) for r in result["reports"]]
    client = variant["remote"] or variant.get("client", False) or bool(variant.get("imports"))
    checkouts = {key: checkout for key, (checkout, _) in trees.items()}
    result["client file"] = check_trees(name, imports, tree, checkouts, client_required=client)
    return result


def _row(name: str, result: dict[str, Any]) -> str:
    workers = [p for p in result["peaks"] if p["role"] == "worker"] or result["peaks"]
    cells = [f"{mean(w.get(key, 0.0) for w in workers):.0f}" for key in SHOWN]
    reports = result["reports"]
    hwm = max((r["status"]["VmHWM"] for r in reports), default=0.0)
    glibc = max((r["glibc"].get("free, kept", 0.0) for r in reports), default=0.0)
    arena = max((r["glibc"].get("arenas", 0.0) for r in reports), default=0.0)
    pool = max((r.get("pyarrow pool", {}).get("peak MiB", 0.0) for r in reports), default=0.0)
    return (
        f"| {name} | {result['peak_total_mib']:.0f} | {hwm:.0f} | "
        + " | ".join(cells)
        + f" | {arena:.0f} / {glibc:.0f} | {pool:.0f} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=300_000, help="rows of the tabular model's input")
    parser.add_argument("--files", type=int, default=4, help="parquet files, hence Spark partitions")
    parser.add_argument("--batch-rows", type=int, default=16384, help="Spark's maxRecordsPerBatch")
    parser.add_argument("--runs", type=int, default=2, help="runs of the job in each application")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the variants, in alternate order")
    parser.add_argument("--variants", default="floor,remote_predict", help=f"among: {', '.join(VARIANTS)}")
    parser.add_argument(
        "--baseline",
        default="",
        help="another checkout (or its tree of links) whose client runs as a further variant",
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    configure_logging()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; expected some of {list(VARIANTS)}")
    baseline = None
    if args.baseline:
        try:
            baseline = baseline_checkout(Path(args.baseline))
        except ValueError as error:
            parser.error(f"--baseline: {error}")
        names.append(BASELINE)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with Workspace() as workspace:
        repository = workspace.repository("memory", {MODEL: {}})
        server = workspace.start_server(repository, "memory")
        data = workspace.path("data")
        write_dataset(data, MODEL, args.rows, args.files)
        trees = {"current": (REPO_ROOT, str(REPO_ROOT))}
        if baseline is not None:
            trees["baseline"] = (baseline, baseline_path(baseline, workspace.path("baseline")))
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                logger.info("worker memory: %s, round %d", name, round_index + 1)
                started = time.perf_counter()
                try:
                    result = _run_variant(name, data, server.grpc_target(), args, workspace.root, trees)
                except WrongTreeError as error:
                    logger.error("worker memory: %s", error)
                    return 1
                results[name].append(result)
                logger.info("worker memory: %s done in %.0f s", name, time.perf_counter() - started)
    header = ["variant", "daemon + workers peak", "worker VmHWM", *(f"worker: {k}" for k in SHOWN)]
    print(f"\nMiB; per-worker columns: mean over a run's workers at each one's peak ({args.rows:,} rows)")
    print("| " + " | ".join([*header, "glibc arenas / free kept", "pyarrow pool peak"]) + " |")
    print("|" + "---|" * (len(header) + 2))
    for name, runs in results.items():
        for result in runs:
            print(_row(name, result))
    packages = {
        name: set().union(*(r["packages"] for run in runs for r in run["reports"]))
        for name, runs in results.items()
    }
    floor = packages.get("floor", set())
    for name, imported in packages.items():
        if name != "floor" and floor:
            print(f"\npackages in {name}'s workers, not in the floor's: {sorted(imported - floor)}")
    print("\nthe client each variant's driver and workers imported (checked against its checkout):")
    for name, runs in results.items():
        print(f"- {name}: {sorted({run['client file'] or 'none imported' for run in runs})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
