"""One Ray Data application running the model over the Spark comparisons' parquet files, in its own
process: the contender teams pick outside Spark for batch inference.

The shape is the one Ray Data's documentation gives for batch inference: ``read_parquet``, then
``map_batches`` with a callable class (the model loaded once in each actor's constructor) on a
fixed pool of actors (``compute=ActorPoolStrategy(size=N)``, the form of Ray 2.4x and later; the
older ``concurrency=N`` is deprecated), consumed by the driver without writing anything. The
model is the same ``model.keras`` called through the same ``tf.function`` as the in-worker Spark
contenders (``benchmarks.inworker``). The parent passes a JSON job and reads one JSON line:

    python -m benchmarks.ray_job '{"model": "tabular_mlp", "data": "...", ...}'

Each application starts its own Ray (``ray.init`` with ``num_cpus`` and an explicit object store
size) and runs the pipeline ``runs`` times. Ray Data's actors live for one execution, so every
run starts its pool and loads the model again; each actor also logs when each of its calls
started and ended, from which the run's rate *with the pool up* is read. Runs alternate between
one pass over the files and ``long_passes`` passes in one execution (a folder of hard links
beside the data: ``steady_rate.long_folder``): the difference of the two takes every fixed cost
out (the pool's start, the model's load), which leaves Ray's steady rate, the one an hours-long
job sees, measured as Spark's is (``benchmarks.steady_rate``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.processes import PeakRssSampler, resident_without_shared_memory
from benchmarks.spark_job import MODELS, REPO_ROOT, SAMPLE_ROWS, JobResult
from benchmarks.steady_rate import SteadyPair, long_folder, steady_runs

CONTENDER = "ray_data"
CPU_GROUPS = ("Ray driver", "Ray system", "Ray workers")
"""The driver (this process: it reads the results), Ray's own processes (GCS, raylet, dashboard,
agents, monitors, Ray Data's helper actors) and the worker processes (read tasks, model actors)."""
SYSTEM_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::ActorLocationTracker", "ray::_")
"""Process titles of Ray's own helpers that run as workers; ``ray::_`` are Ray Data's actors."""


@dataclass
class RayJob:
    model: str
    data: str
    model_file: str
    marker_dir: str
    """Each run's model loads and the actors' call log go to ``<marker_dir>/run-<i>``."""
    runs: int = 1
    long_passes: int = 1
    """Odd runs read the files this many times in one execution; even runs once."""
    pool_size: int = 2
    batch_size: int = 4096
    batch_format: str = "pyarrow"
    num_cpus: int = 2
    object_store_mib: int = 1024
    log_file: str = ""


@dataclass
class RayJobResult(JobResult):
    """A ``JobResult`` (the Spark tables read it as they read a Spark contender's) with Ray's own:
    ``peak_worker_*`` are those of Ray's worker processes, shared memory left out."""

    pool_size: int = 0
    batch_size: int = 0
    batch_format: str = ""
    runs_passes: list[int] = field(default_factory=list)
    """For each run, how many times it read the files."""
    object_store_mib: int = 0
    """The object store's size given to ``ray.init``."""
    init_s: float = 0.0
    pool_start_s: list[float] = field(default_factory=list)
    """For each run, from its start to the first call of any model actor."""
    pool_rows_s: list[float] = field(default_factory=list)
    """For each run, its rows over the span from the first call of any actor to the end of the last."""
    peak_rss_by_group_mib: dict[str, float] = field(default_factory=dict)
    peak_object_store_mib: float = 0.0
    """Pages of the object store's shared-memory file in use at its peak."""
    peak_all_ray_mib: float = 0.0
    """All Ray processes at the same instant, shared memory left out, plus the object store."""

    @property
    def best_run(self) -> int:
        """The fastest one-pass run after the first, or the only one: the job of ``rows`` rows."""
        single = [index for index, passes in enumerate(self.runs_passes) if passes == 1]
        candidates = [index for index in single if index > 0] or single
        return min(candidates, key=lambda index: self.runs_s[index])

    def steady_pair(self) -> SteadyPair | None:
        """The one-pass and the long run the steady rate compares, chosen as for Spark's jobs
        (``steady_rate.steady_runs``) among this application's runs of each kind, whole runs.

        The pool's start stays in each run's time: it is not a fixed cost here. The read tasks run
        while the pool starts and compete with it for the cores, so a long job's pool starts later
        (9-10 s against 7 s on the sequence model) and its reads are partly done by then; timing
        the runs from the first model call overstated Ray by up to 1.56x, a rate its own CPU per
        row could not reach on two cores."""
        single = [i for i, passes in enumerate(self.runs_passes) if passes == 1]
        long = [i for i, passes in enumerate(self.runs_passes) if passes > 1]
        chosen = steady_runs([self.runs_s[i] for i in single], [self.runs_s[i] for i in long])
        if chosen is None:
            return None
        short, fastest_long = single[chosen[0]], long[chosen[1]]
        return SteadyPair(
            self.runs_s[short],
            self.runs_s[fastest_long],
            (self.runs_passes[fastest_long] - 1) * self.rows,
            self.runs_cpu_s[short],
            self.runs_cpu_s[fastest_long],
        )


class Predictor:
    """The callable class ``map_batches`` runs on each actor: the model loaded once per actor."""

    def __init__(self, model_file: str, run_dir: str, column: str, batch_format: str) -> None:
        from benchmarks import inworker

        self._predict = inworker.load_predict_fn(model_file, run_dir)
        self._column = column
        self._batch_format = batch_format
        self._log = open(Path(run_dir) / f"calls-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115

    def __call__(self, batch: Any) -> Any:
        started = time.time()
        if self._batch_format == "pyarrow":
            values = batch.column(self._column).combine_chunks()
            # The flat values of a list column, viewed as rows without a copy.
            inputs = values.flatten().to_numpy().reshape(len(values), -1)
            ids = batch.column("id")
        else:
            inputs = batch[self._column]
            if inputs.dtype == object:  # rows that Ray could not stack itself
                inputs = np.stack(inputs)
            ids = batch["id"]
        outputs = self._predict(np.ascontiguousarray(inputs, dtype=np.float32))
        self._log.write(f"{started} {time.time()} {len(outputs)}\n")
        if self._batch_format == "pyarrow":
            flat = pa.array(outputs.reshape(-1))
            return pa.table(
                {"id": ids, "prediction": pa.FixedSizeListArray.from_arrays(flat, outputs.shape[1])}
            )
        return {"id": ids, "prediction": outputs}


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _ray_processes() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _workers() -> Iterator[psutil.Process]:
    for process in _ray_processes():
        title = _title(process)
        if title.startswith("ray::") and not title.startswith(SYSTEM_TITLES):
            yield process


def _system() -> Iterator[psutil.Process]:
    for process in _ray_processes():
        title = _title(process)
        if title and not (title.startswith("ray::") and not title.startswith(SYSTEM_TITLES)):
            yield process


def object_store_bytes() -> int:
    """Bytes in use of the object store's shared-memory files, read from raylet's descriptors.

    The plasma store lives in raylet and maps its memory from files it creates in ``/dev/shm``
    (or a disk folder when that is too small) and unlinks at once: the files have no name left to
    look at, but raylet keeps them open, and their allocated blocks are the pages in use, each
    counted once whatever number of workers map it.
    """
    total = 0
    for process in _ray_processes():
        try:
            if process.name() != "raylet":
                continue
            descriptors = os.listdir(f"/proc/{process.pid}/fd")
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
        for descriptor in descriptors:
            path = f"/proc/{process.pid}/fd/{descriptor}"
            try:
                if "plasma" in os.readlink(path):
                    total += os.stat(path).st_blocks * 512
            except OSError:
                continue
    return total


class RayMemorySampler(PeakRssSampler):
    """Samples, in a thread, all Ray processes (shared memory left out) plus the object store, at
    the same instant: ``peak_total_bytes`` is the peak of what the Ray application holds in all."""

    def __init__(self, interval_s: float = 0.2) -> None:
        super().__init__(
            lambda: [psutil.Process(), *_ray_processes()],
            interval_s=interval_s,
            resident=resident_without_shared_memory,
        )
        self.peak_object_store_bytes = 0

    def sample(self) -> int:
        resident = super().sample()
        store = object_store_bytes()
        self.peak_object_store_bytes = max(self.peak_object_store_bytes, store)
        # The store is never negative, so this peak also bounds the resident-only one kept above.
        self.peak_total_bytes = max(self.peak_total_bytes, resident + store)
        return resident + store


def _start_ray(job: RayJob) -> None:
    import ray

    # Ray's workers inherit raylet's environment, which is this process's: the benchmark's modules
    # (the callable class) must be importable there.
    paths = (str(REPO_ROOT), os.environ.get("PYTHONPATH", ""))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    ray.init(
        num_cpus=job.num_cpus,
        object_store_memory=job.object_store_mib * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False


def _dataset(job: RayJob, run_dir: Path, passes: int) -> Any:
    import ray

    column = MODELS[job.model][0]
    source = job.data
    if passes > 1:
        source = str(long_folder(Path(job.data), passes))
    return (
        ray.data.read_parquet(str(source))
        .select_columns(["id", column])
        .map_batches(
            Predictor,
            fn_constructor_args=(job.model_file, str(run_dir), column, job.batch_format),
            compute=ray.data.ActorPoolStrategy(size=job.pool_size),
            batch_size=job.batch_size,
            batch_format=job.batch_format,
            num_cpus=actor_cpus(job),
        )
    )


def actor_cpus(job: RayJob) -> float:
    """Logical CPUs each model actor reserves: all but one, shared by the pool. An actor reserves
    one by default, and a pool holding every CPU leaves none for the read tasks it waits for (the
    pipeline then stalls for good); the cores themselves stay shared by all processes."""
    return (job.num_cpus - 1) / job.pool_size


def _consume(dataset: Any, rows: int) -> tuple[np.ndarray, dict[str, list[float]]]:
    """Iterate over the results without writing them: how often each id came back, and the first
    rows' predictions."""
    ids: list[np.ndarray] = []
    sample: dict[str, list[float]] = {}
    for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        batch_ids = batch.column("id").to_numpy()
        ids.append(batch_ids)
        for index in np.flatnonzero(batch_ids < SAMPLE_ROWS):
            sample[str(int(batch_ids[index]))] = [
                float(v) for v in batch.column("prediction")[int(index)].values
            ]
    every = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if every.size and (every.min() < 0 or every.max() >= rows):
        raise RuntimeError(f"ids outside 0..{rows - 1} came back: {every.min()}..{every.max()}")
    return np.bincount(every, minlength=rows), sample


def _pool_span(run_dir: Path) -> tuple[float, float, int]:
    """The first call's start, the last call's end and the rows of all the actors' calls."""
    calls = [
        line.split() for log in run_dir.glob("calls-*.log") for line in log.read_text().splitlines() if line
    ]
    if not calls:
        raise RuntimeError(f"no model actor logged a call in {run_dir}")
    return min(float(c[0]) for c in calls), max(float(c[1]) for c in calls), sum(int(c[2]) for c in calls)


def run_job(job: RayJob) -> RayJobResult:
    import ray

    files = sorted(Path(job.data).glob("*.parquet"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    result = RayJobResult(
        CONTENDER,
        job.model,
        rows,
        len(files),
        pool_size=job.pool_size,
        batch_size=job.batch_size,
        batch_format=job.batch_format,
        object_store_mib=job.object_store_mib,
    )
    started = time.perf_counter()
    _start_ray(job)
    result.init_s = time.perf_counter() - started
    driver = PeakRssSampler(lambda: [psutil.Process()], interval_s=0.2)
    system = PeakRssSampler(_system, interval_s=0.2, resident=resident_without_shared_memory)
    workers = PeakRssSampler(_workers, interval_s=0.05, pss_every=5, resident=resident_without_shared_memory)
    memory = RayMemorySampler()
    with memory, driver, system, workers:
        samplers = dict(zip(CPU_GROUPS, (driver, system, workers), strict=True))
        for run in range(job.runs):
            passes = job.long_passes if run % 2 else 1
            run_dir = Path(job.marker_dir) / f"run-{run}"
            run_dir.mkdir(parents=True, exist_ok=True)
            before = {group: sampler.cpu_snapshot() for group, sampler in samplers.items()}
            started_wall, started = time.time(), time.perf_counter()
            counts, sample = _consume(_dataset(job, run_dir, passes), rows)
            result.runs_s.append(time.perf_counter() - started)
            result.runs_cpu_s.append({g: s.cpu_since(before[g]) for g, s in samplers.items()})
            result.runs_passes.append(passes)
            if not (counts == passes).all():
                raise RuntimeError(
                    f"run {run}: every id must come back exactly {passes} time(s); "
                    f"{int((counts < passes).sum())} came back fewer, {int((counts > passes).sum())} more"
                )
            first_call, last_call, called_rows = _pool_span(run_dir)
            if called_rows != rows * passes:
                raise RuntimeError(
                    f"run {run}: the actors were called on {called_rows} rows, expected {rows * passes}"
                )
            result.pool_start_s.append(first_call - started_wall)
            result.pool_rows_s.append(called_rows / (last_call - first_call))
            result.sample = sample
    result.peak_worker_rss_total_mib = workers.peak_total_bytes / 2**20
    result.peak_worker_rss_single_mib = workers.peak_single_bytes / 2**20
    result.peak_worker_pss_total_mib = workers.peak_pss_total_bytes / 2**20
    result.python_workers_seen = len(workers.pids_seen)
    result.peak_rss_by_group_mib = {g: s.peak_total_bytes / 2**20 for g, s in samplers.items()}
    result.peak_object_store_mib = memory.peak_object_store_bytes / 2**20
    result.peak_all_ray_mib = memory.peak_total_bytes / 2**20
    result.measure_steady()
    result.model_loads_in_workers = sum(
        1 for f in Path(job.marker_dir).glob("run-*/*") if "calls-" not in f.name
    )
    ray.shutdown()
    return result


def run_in_child(job: RayJob, timeout_s: float = 900.0) -> RayJobResult:
    """Run ``job`` in a fresh process with its own Ray; Ray's output goes to ``job.log_file``."""
    from benchmarks.processes import run_json_child

    what = f"Ray Data job on {job.model} (pool {job.pool_size}, batches of {job.batch_size})"
    return RayJobResult(
        **run_json_child("benchmarks.ray_job", asdict(job), job.log_file, what, {}, timeout_s)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    result = run_job(RayJob(**json.loads(args[0])))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
