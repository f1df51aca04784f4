"""Probe: what each import of ``remote_predict``'s pandas path adds to a Spark Python worker.

    python -m benchmarks.worker_imports [--rounds 3]

One Spark application (local[2], Python workers not reused, so every task runs in a worker the
daemon has just forked) runs two jobs of two partitions each, ``--rounds`` times:

- *a bare task* (an RDD's ``mapPartitions``): a worker holding only what PySpark's daemon gave
  it imports, one step at a time, what a pandas UDF's worker imports (numpy, pyarrow, pandas,
  PySpark's Arrow serializers), then what ``remote_predict``'s function imports there, in the
  order of their dependencies, then what is not on that path (for comparison);
- *a pandas UDF*: the same client steps in the function of a pandas UDF, after PySpark has
  loaded what it needs to hand it its first batch, as ``remote_predict``'s function does.

After each step the worker reads its own ``/proc/self/smaps_rollup``: resident size (RSS),
proportional set size (PSS: a page shared with the daemon or another worker counted in part)
and private pages (USS: what the worker alone holds). The table gives each step's median
increase over the workers and rounds, and its time. A second table, from ``python -X
importtime`` in a fresh interpreter that first imports what the pandas UDF's worker holds, gives
the import time of the client's path by package. Memory and import time
only: the memory of the requests in flight is ``benchmarks.worker_memory``'s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.cli import configure_logging
from benchmarks.processes import child_env

logger = logging.getLogger(__name__)

# What PySpark's worker imports to run any pandas UDF, before the function sees a batch.
PANDAS_WORKER = (
    ("numpy", "import numpy"),
    ("pyarrow", "import pyarrow"),
    ("pandas", "import pandas"),
    (
        "PySpark's Arrow serializers (the daemon's fork holds them)",
        "import pyspark.sql.pandas.serializers, pyspark.sql.pandas.types",
    ),
)
# What remote_predict's function imports in a task, its dependencies first.
CLIENT = (
    ("grpc", "import grpc"),
    ("protobuf + udfserve's protocol messages", "import udfserve.protocol"),
    (
        "the node's plain records (udfserve.records, node_leases, discovery)",
        "import udfserve.discovery, udfserve.node_leases",
    ),
    (
        "common/node_start.py, task_config.py (plain dataclasses)",
        "import udfserve.spark_client.common.task_config",
    ),
    (
        "common/ rest (errors, model_spec, versions)",
        "import udfserve.spark_client.common.versions, udfserve.spark_client.common.errors",
    ),
    (
        "wire/* (transport, channels, arrow_wire, shared memory)",
        "import udfserve.spark_client.wire.protocols",
    ),
    (
        "nodes/routing.py, fallback_report.py",
        "import udfserve.spark_client.nodes.routing, udfserve.spark_client.nodes.fallback_report",
    ),
    (
        "observability/*",
        "import udfserve.spark_client.observability.stats, udfserve.spark_client.observability.tracing",
    ),
    ("executor/* (partition, task, pandas_udf)", "import udfserve.spark_client.executor.pandas_udf"),
)
# Not on that path: measured after it, for comparison.
OFF_PATH = (
    (
        "pydantic with ClientConfig, the driver's (not on the path)",
        "import udfserve.spark_client.common.config",
    ),
    ("pydantic_settings (not on the path)", "import pydantic_settings"),
    (
        "the KServe wire: tritonclient (not on the default path)",
        "import udfserve.spark_client.wire.kserve_transport",
    ),
)
HEAVY = ("grpc", "google.protobuf", "pydantic", "pydantic_core", "pydantic_settings", "udfserve", "pyarrow")


# -- in the worker -------------------------------------------------------------------------------
def _rollup_mib() -> dict[str, float]:
    values: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) / 1024
    return {
        "rss": values["Rss"],
        "pss": values["Pss"],
        "uss": values["Private_Clean"] + values["Private_Dirty"],
    }


def _measure(steps: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each step's statement run in this process, with what it added (already there: zero)."""
    import gc
    import time

    gc.collect()
    before = _rollup_mib()
    rows = []
    for name, statement in steps:
        modules = len(sys.modules)
        started = time.perf_counter()
        exec(statement, {})  # the benchmark's own import statements
        elapsed_ms = (time.perf_counter() - started) * 1000
        gc.collect()
        after = _rollup_mib()
        rows.append(
            {
                "step": name,
                "ms": elapsed_ms,
                "modules": len(sys.modules) - modules,
                **{key: after[key] - before[key] for key in after},
            }
        )
        before = after
    return rows


def _heavy_modules() -> list[str]:
    return sorted({m.partition(".")[0] for m in sys.modules if m.partition(".")[0] in (*HEAVY, "google")})


def _measure_all(before_client: Sequence[tuple[str, str]], where: str, report_dir: str) -> None:
    """The steps up to the client's, then the heavy packages the worker holds, then the rest."""
    rows = _measure((*before_client, *CLIENT))
    heavy = _heavy_modules()
    _report(where, [*rows, *_measure(OFF_PATH)], heavy, report_dir)


def _report(where: str, rows: list[dict[str, Any]], heavy: list[str], report_dir: str) -> None:
    payload = {"where": where, "pid": os.getpid(), "end": _rollup_mib(), "rows": rows, "heavy": heavy}
    (Path(report_dir) / f"{where}-{os.getpid()}.json").write_text(json.dumps(payload))


def bare_task(report_dir: str) -> Any:
    """An RDD ``mapPartitions`` function: every step, from a freshly forked worker."""

    def run(_: Iterator[int]) -> Iterator[int]:
        _measure_all(PANDAS_WORKER, "bare task", report_dir)
        yield os.getpid()

    return run


def pandas_task(report_dir: str) -> Any:
    """An iterator pandas UDF's function: the client's steps once its first batch has arrived."""
    import pandas as pd

    def run(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        measured = False
        for series in batches:
            if not measured:
                _measure_all((), "pandas UDF", report_dir)
                measured = True
            yield series

    run.__annotations__ = {"batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    return run


def run_child(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import pandas_udf

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-worker-imports")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.python.worker.reuse", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    report_dir = spec["report_dir"]
    udf = pandas_udf(pandas_task(report_dir), returnType="long")  # type: ignore[call-overload]
    for _ in range(spec["rounds"]):
        spark.sparkContext.parallelize(range(2), 2).mapPartitions(bare_task(report_dir)).collect()
        spark.range(0, 2, 1, 2).select(udf("id")).write.format("noop").mode("overwrite").save()
    spark.stop()


# -- in the parent -------------------------------------------------------------------------------
_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)$")


def import_times() -> dict[str, float]:
    """Import time (ms, the modules' own times summed) by top-level package of what the client's
    pandas function imports, from ``-X importtime`` in a fresh interpreter that first imports what
    a pandas UDF's worker holds."""
    prelude = "; ".join(s for _, s in PANDAS_WORKER) + "; import pyspark.worker"
    code = (
        f"{prelude}; import sys; sys.stderr.write('--client--\\n'); "
        "import udfserve.spark_client.executor.pandas_udf"
    )
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    _, _, client = completed.stderr.partition("--client--\n")
    totals: dict[str, float] = defaultdict(float)
    for line in client.splitlines():
        found = _IMPORTTIME.match(line)
        if found:
            module = found.group(4)
            top = next((p for p in HEAVY if module == p or module.startswith(p + ".")), "other modules")
            totals[top] += int(found.group(1)) / 1000
    totals["all of it"] = sum(totals.values())
    return dict(totals)


def _table(reports: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| where | step | RSS MiB | PSS MiB | private MiB | ms | modules |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for where in ("bare task", "pandas UDF"):
        runs = [r["rows"] for r in reports if r["where"] == where]
        if not runs:
            continue
        end = median(r["end"]["rss"] for r in reports if r["where"] == where)
        totals = {key: 0.0 for key in ("rss", "pss", "uss", "ms")}
        client_totals = dict(totals)
        client_steps = {name for name, _ in CLIENT}
        for index, row in enumerate(runs[0]):
            cells = {
                key: median(run[index][key] for run in runs) for key in ("rss", "pss", "uss", "ms", "modules")
            }
            lines.append(
                f"| {where} | {row['step']} | {cells['rss']:.1f} | {cells['pss']:.1f} | "
                f"{cells['uss']:.1f} | {cells['ms']:.0f} | {cells['modules']:.0f} |"
            )
            for key in totals:
                if row["step"] in client_steps:
                    client_totals[key] += cells[key]
        lines.append(
            f"| {where} | **remote_predict's client, all steps** | {client_totals['rss']:.1f} | "
            f"{client_totals['pss']:.1f} | {client_totals['uss']:.1f} | {client_totals['ms']:.0f} | |"
        )
        logger.info("%s: %d workers measured, median RSS at the end %.0f MiB", where, len(runs), end)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3, help="times each job runs (two workers each)")
    args = parser.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0
    configure_logging()
    with tempfile.TemporaryDirectory(prefix="udfserve-worker-imports-") as report_dir:
        spec = {"report_dir": report_dir, "rounds": args.rounds}
        subprocess.run(
            [sys.executable, "-m", "benchmarks.worker_imports", "--child", json.dumps(spec)],
            env=child_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}),
            check=True,
        )
        reports = [json.loads(p.read_text()) for p in sorted(Path(report_dir).glob("*.json"))]
    print("\nWhat each import adds to a Spark Python worker (median over workers and rounds)")
    print("\n".join(_table(reports)))
    on_path = set().union(*(r["heavy"] for r in reports if r["where"] == "pandas UDF"))
    print(f"\npackages of {HEAVY} in a pandas UDF's worker after the client's steps: {sorted(on_path)}")
    print("\nImport time by package: its modules' own times summed (python -X importtime, fresh interpreter")
    print("after a pandas UDF worker's imports; a model class built at import counts to its module)")
    print("| package | ms |\n|---|---:|")
    for package, ms in import_times().items():
        print(f"| {package} | {ms:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
