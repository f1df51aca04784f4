"""Ray Data in the end-to-end comparison: its sweep, its tables and its target, beside Spark's.

Ray is heavy and outside the CI run: it comes with the ``bench-ray`` dependency group, and the comparison
runs it only where ``ray`` is importable. A fair user tunes Ray Data before comparing, so each
round starts with a small sweep (the actor pool's size, the batch size) and quotes its best (by
its steady rate); later rounds run that best setting again. Each application alternates a job of
one pass over the files with one of ``LONG_PASSES`` passes (``benchmarks.ray_job``): the first
gives the rate per job of that size, the difference of the two Ray's steady rate.

    python -m benchmarks.ray_contender [--quick] [--rows N] [--model M] [--with-spark]

runs Ray Data alone on one data set (with ``--with-spark``, also ``remote_predict`` with
``udf_type='arrow'`` and ``predict_files``, the files read in the Python workers, against one model
server in the same run, their steady rates measured as Ray's: each compared with Ray's per job
and steady against steady).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.cli import configure_logging
from benchmarks.processes import LOGS_DIR, Workspace
from benchmarks.ray_job import CPU_GROUPS, RayJob, RayJobResult, actor_cpus, run_in_child
from benchmarks.report import Table, TargetCheck
from benchmarks.spark_job import JobResult

logger = logging.getLogger(__name__)

LABEL = "Ray Data, map_batches on an actor pool (model in the actors)"
INSTALL = "pip install --group bench-ray (in the checkout: a dependency group of pyproject.toml)"
TARGET_RATIO = 1.0
POOL_SIZES = (1, 2)
BATCH_SIZES = (4096, 16384)
"""1,024 rows was the slowest with the pool up in a trial sweep (more calls, the same fixed cost each)."""
QUICK_SETTING = (2, 4096)
RUNS, QUICK_RUNS = 4, 3
"""Runs alternate one pass and ``LONG_PASSES``: (1, 8, 1, 8); quick (1, 2, 1). The first runs cold."""
LONG_PASSES, QUICK_LONG_PASSES = 8, 2
OBJECT_STORE_MIB = 1024


def available() -> bool:
    """Whether ``ray`` can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("ray") is not None


def sweep_settings(quick: bool) -> list[tuple[int, int]]:
    """(pool size, batch size) pairs of the sweep: one in the quick mode."""
    return [QUICK_SETTING] if quick else [(pool, batch) for pool in POOL_SIZES for batch in BATCH_SIZES]


def rows_per_s(result: JobResult) -> float:
    """Each job's rows over its wall time, the fastest after the first (as for Spark's jobs)."""
    return result.rows / result.runs_s[result.best_run]


def run_round(
    workspace: Workspace,
    model: str,
    data: Path,
    model_file: str,
    quick: bool,
    settings: Sequence[tuple[int, int]],
) -> tuple[RayJobResult, list[RayJobResult]]:
    """One application per setting, each with its own Ray; the steadiest and all of them."""
    results = []
    for pool_size, batch_size in settings:
        logger.info("ray: %s, pool %d, batches of %d", model, pool_size, batch_size)
        job = RayJob(
            model=model,
            data=str(data),
            model_file=model_file,
            marker_dir=str(workspace.path(f"ray-{model}-{pool_size}-{batch_size}")),
            runs=QUICK_RUNS if quick else RUNS,
            long_passes=QUICK_LONG_PASSES if quick else LONG_PASSES,
            pool_size=pool_size,
            batch_size=batch_size,
            object_store_mib=OBJECT_STORE_MIB,
            log_file=str(LOGS_DIR / f"ray-{model}-{pool_size}-{batch_size}.log"),
        )
        LOGS_DIR.mkdir(parents=True, exist_ok=True)
        results.append(run_in_child(job))
    return max(results, key=lambda result: result.steady_rows_s), results


def best_of(rounds: Sequence[RayJobResult]) -> RayJobResult:
    """The steadiest round, with the highest memory peaks of any round."""
    fastest = max(rounds, key=lambda result: result.steady_rows_s)
    groups = {g for r in rounds for g in r.peak_rss_by_group_mib}
    return replace(
        fastest,
        peak_worker_rss_total_mib=max(r.peak_worker_rss_total_mib for r in rounds),
        peak_worker_rss_single_mib=max(r.peak_worker_rss_single_mib for r in rounds),
        peak_worker_pss_total_mib=max(r.peak_worker_pss_total_mib for r in rounds),
        peak_rss_by_group_mib={g: max(r.peak_rss_by_group_mib.get(g, 0.0) for r in rounds) for g in groups},
        peak_object_store_mib=max(r.peak_object_store_mib for r in rounds),
        peak_all_ray_mib=max(r.peak_all_ray_mib for r in rounds),
        model_loads_in_workers=max(r.model_loads_in_workers for r in rounds),
        rounds_rows_s=[rows_per_s(r) for r in rounds],
        rounds_steady_rows_s=[r.steady_rows_s for r in rounds],
    )


def pool_rows_s(result: RayJobResult) -> float:
    """The rate with the pool up (from the first model call to the end of the last), the best of
    any run: Ray's best case, the reads done while the pool started left out."""
    return max(result.pool_rows_s)


def sweep_table(sweeps: Mapping[str, Sequence[RayJobResult]]) -> Table:
    table = Table(
        "Ray Data's sweep (first round): one application per setting, the best quoted in the tables above",
        [
            "model",
            "actor pool",
            "CPUs per actor",
            "batch size",
            "rows/s per job",
            "steady rows/s",
            "rows/s with the pool up",
            "pool start s",
            "Ray start s",
        ],
    )
    for model, results in sweeps.items():
        for result in results:
            job = RayJob(model, "", "", "", pool_size=result.pool_size)
            table.rows.append(
                {
                    "model": model,
                    "actor pool": result.pool_size,
                    "CPUs per actor": actor_cpus(job),
                    "batch size": result.batch_size,
                    "rows/s per job": rows_per_s(result),
                    "steady rows/s": result.steady_rows_s or None,
                    "rows/s with the pool up": pool_rows_s(result),
                    "pool start s": result.pool_start_s[result.best_run],
                    "Ray start s": result.init_s,
                }
            )
    return table


def memory_table(results: Mapping[str, RayJobResult]) -> Table:
    table = Table(
        "Ray Data's memory: peak resident MiB by process group (shared memory left out), the object store "
        "(counted once), and all of it at one instant",
        ["model", *CPU_GROUPS, "object store in use", "object store size", "all Ray processes and store"],
    )
    for model, result in results.items():
        table.rows.append(
            {
                "model": model,
                **{g: result.peak_rss_by_group_mib.get(g) for g in CPU_GROUPS},
                "object store in use": result.peak_object_store_mib,
                "object store size": float(result.object_store_mib),
                "all Ray processes and store": result.peak_all_ray_mib,
            }
        )
    return table


def targets(
    per_job: Mapping[str, tuple[str, float]],
    steady: Mapping[str, tuple[str, float]],
    results: Mapping[str, RayJobResult],
) -> list[TargetCheck]:
    """By model, udfserve's fastest Spark path and its rows/s, ``per_job`` by its rate per job and
    ``steady`` by its steady rate (0: not measured); each is compared with Ray's of the same kind."""
    if not results:
        return [
            TargetCheck(
                f"udfserve's best Spark path at least {TARGET_RATIO:.1f}x Ray Data's rows/s, per job and "
                "steady",
                f"not measured: ray is not installed ({INSTALL})",
                None,
            )
        ]
    checks = []
    for model, result in results.items():
        name, speed = per_job[model]
        ray_per_job = rows_per_s(result)
        checks.append(
            TargetCheck(
                f"{model}: udfserve's best Spark path per job at least {TARGET_RATIO:.1f}x Ray Data's "
                "rows/s per job (each job's rows over its wall time, its fixed costs included)",
                f"{speed / ray_per_job:.2f}x ({name} {speed:,.0f} vs {ray_per_job:,.0f} rows/s per job)",
                speed / ray_per_job >= TARGET_RATIO,
            )
        )
        steady_name, steady_speed = steady[model]
        ray_steady = result.steady_rows_s
        rates = (("udfserve's", steady_speed), ("Ray Data's", ray_steady))
        missing = [who for who, rate in rates if not rate]
        checks.append(
            TargetCheck(
                f"{model}: udfserve's best steady Spark path at least {TARGET_RATIO:.1f}x Ray Data's steady "
                f"rate (each a long job's extra rows over its extra time, a job of "
                f"{max(result.runs_passes, default=LONG_PASSES)} passes over the files against one: every "
                "fixed cost of a job left out, what a job of hours sees)",
                f"{steady_speed / ray_steady:.2f}x ({steady_name} {steady_speed:,.0f} vs {ray_steady:,.0f} "
                "rows/s steady)"
                if not missing
                else f"not measured in this run ({' and '.join(missing)} steady rate)",
                steady_speed / ray_steady >= TARGET_RATIO if not missing else None,
            )
        )
    return checks


METHOD = (
    "Ray Data (`ray[data]`, the `bench-ray` group) reads the same parquet files and runs the same "
    "`model.keras` through the same `tf.function` in `map_batches` with a callable class (the model "
    "loaded once in each actor's constructor) on a fixed actor pool "
    "(`compute=ActorPoolStrategy(size=N)`), Arrow batches in and out (`batch_format='pyarrow'`, the "
    "list column flattened without a copy), and the driver consumes the result with `iter_batches` "
    "without writing it, checking that every id comes back exactly once. Each setting is its own "
    "application: `ray.init(num_cpus=2, object_store_memory=1 GiB)`, no dashboard. The actors share "
    "one logical CPU fewer than Ray has (a pool holding every CPU leaves none for the read tasks and "
    "stalls). Ray Data's actors live for one execution: every job starts its pool and loads the model "
    "again, which its *rows/s* includes (the fastest job after the first, as for Spark). To see past "
    f"those fixed costs, the application alternates that job with one reading the files {LONG_PASSES} "
    "times in one execution (each id checked to come back that often): *steady rows/s* is the long "
    "job's extra rows over its extra time (the fastest of each kind after the first, whole jobs: the "
    "reads that run while the pool starts are work, not a fixed cost): Ray's rate with every fixed "
    "cost out, which the steady target compares with "
    "udfserve's steady rate, measured the same way; *rows/s with the pool up* counts "
    "from the first model call of any actor to the end of the last, the reads done while the pool "
    "started left out. "
    f"The first round sweeps the pool ({', '.join(map(str, POOL_SIZES))} actors) and the batch size "
    f"({', '.join(f'{b:,}' for b in BATCH_SIZES)} rows) and quotes the setting of the best steady rate, "
    "later rounds rerun it. Memory: the Ray "
    "workers' column is the read tasks' and actors' processes; the object store (plasma, in raylet, "
    "mapped from files in `/dev/shm` that raylet unlinks and keeps open) is read once, from the blocks "
    "of those files, and every process's pages of shared memory are left out of its resident size, so "
    "the store is not counted once per process that maps it. CPU: Ray's driver (this process), Ray's "
    "own processes (GCS, raylet, agents, Ray Data's helper actors) and the workers."
)


SPARK_CONTENDERS = ("remote_predict_arrow", "predict_files")


def _spark_paths(
    workspace: Workspace, model: str, data: Path, runs: int, long_passes: int
) -> dict[str, JobResult]:
    """udfserve's Arrow paths against one model server, their jobs alternating as Ray's do."""
    from benchmarks.spark_job import Job
    from benchmarks.spark_job import run_in_child as run_spark

    repository = workspace.repository("ray-compare", {model: {}})
    server = workspace.start_server(repository, "ray-compare")
    try:
        return {
            contender: run_spark(
                Job(
                    contender=contender,
                    model=model,
                    data=str(data),
                    address=server.grpc_target(),
                    server_pid=server.pid,
                    runs=runs,
                    long_passes=long_passes,
                    log_file=str(LOGS_DIR / f"ray-compare-{model}-{contender}.log"),
                )
            )
            for contender in SPARK_CONTENDERS
        }
    finally:
        workspace.stop_server(server)


def _against_ray(contender: str, result: JobResult, ray: RayJobResult) -> str:
    """One Spark path beside Ray's best: per job against per job, steady against steady."""
    speed, ray_speed = rows_per_s(result), rows_per_s(ray)
    steady, ray_steady = result.steady_rows_s, ray.steady_rows_s
    steady_text = (
        f"steady {steady:,.0f} rows/s, {steady / ray_steady:.2f}x Ray's steady {ray_steady:,.0f}"
        if steady and ray_steady
        else f"steady rate not measured (udfserve {steady:,.0f}, Ray {ray_steady:,.0f})"
    )
    cpu = {k: round(v * 1e6 / result.rows, 2) for k, v in result.runs_cpu_s[result.best_run].items()}
    steady_cpu = {k: round(v, 2) for k, v in result.steady_cpu_s_per_million_rows.items()}
    ray_steady_cpu = {k: round(v, 2) for k, v in ray.steady_cpu_s_per_million_rows.items()}
    shared = [key for key in result.sample if key in ray.sample]
    difference = max(
        (abs(x - y) for key in shared for x, y in zip(result.sample[key], ray.sample[key], strict=True)),
        default=float("nan"),
    )
    return (
        f"\n{contender}: per job {speed:,.0f} rows/s, {speed / ray_speed:.2f}x Ray's per job "
        f"{ray_speed:,.0f}; {steady_text}. CPU-s per million rows per job: {cpu}; at the steady rate: "
        f"{steady_cpu} (Ray's: {ray_steady_cpu}); max |Δ| against Ray's first {len(shared)} rows: "
        f"{difference:.2g}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="one setting, one job: checks that Ray Data runs"
    )
    parser.add_argument(
        "--rows", type=int, default=0, help="rows of the data set (default: 20,000 quick, 200,000)"
    )
    parser.add_argument("--model", default="tabular_mlp", choices=("tabular_mlp", "sequence_bilstm"))
    parser.add_argument(
        "--with-spark",
        action="store_true",
        help="also remote_predict(udf_type='arrow') and predict_files (the files read in the Python "
        "workers), their steady rates measured as Ray's",
    )
    parser.add_argument(
        "--setting", default="", help="one setting instead of the sweep: POOL,BATCH (e.g. 2,16384)"
    )
    args = parser.parse_args(argv)
    if not available():
        parser.error(f"ray is not installed: {INSTALL}")
    configure_logging()
    from benchmarks.spark_job import write_dataset

    rows = args.rows or (20_000 if args.quick else 200_000)
    # udfserve's short jobs (--with-spark), a long one between each two: quick (1, 2, 1), else (1, 8, 1, 8, 1)
    runs, long_passes = (2, QUICK_LONG_PASSES) if args.quick else (3, LONG_PASSES)
    with Workspace() as workspace:
        data = workspace.path(f"data-{args.model}")
        write_dataset(data, args.model, rows, 4)
        model_file = workspace.example_models() / args.model / "1" / "model.keras"
        pool, _, batch = args.setting.partition(",")
        settings = [(int(pool), int(batch))] if args.setting else sweep_settings(args.quick)
        best, sweep = run_round(workspace, args.model, data, str(model_file), args.quick, settings)
        spark = _spark_paths(workspace, args.model, data, runs, long_passes) if args.with_spark else {}
    table = sweep_table({args.model: sweep})
    print(table.to_markdown())
    print(memory_table({args.model: best}).to_markdown())
    for contender, result in spark.items():
        print(_against_ray(contender, result, best))
    print(json.dumps({"best": asdict(best), "sweep": [asdict(r) for r in sweep]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
