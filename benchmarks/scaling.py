"""Comparison 8, scaling with the rows: the same Spark job at three sizes, 1x, 4x and 16x.

    python -m benchmarks.scaling [--quick]

The tabular MLP at 1M, 4M and 16M rows and the sequence model at 100k, 400k and 1.6M rows, each
through ``remote_predict`` (pandas UDF), ``remote_predict(udf_type='arrow')`` and Spark's
``predict_batch_udf``. Every point is its own Spark application (``benchmarks.spark_job``) and,
for udfserve, its own fresh model server: the memory quoted is what a job of that size made the
processes hold, not what earlier jobs left behind. Questions asked: does rows/s hold as the job
grows, and does the peak resident memory of the server and of the Python workers stay where it
was?

The largest data set of a model is written once, in equal files; a smaller size is a folder of
hard links to its first files, so every size reads the same bytes in the same file layout. Before
its timed run, each application sends the smallest size's rows through the same UDF, untimed:
that run pays the workers' start, TensorFlow's import and the model's load, so the one timed run
of every size is warm and rows/s compares across sizes.

``--quick`` checks that the script works: the tabular MLP at 8,192 rows through every contender and
at 16,384 through ``remote_predict`` alone (four applications; the targets of that contender only).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.processes import LOGS_DIR, PeakRssSampler, Workspace
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.spark_e2e import LABELS, TARGET_NAMES, rows_per_s
from benchmarks.spark_job import MODELS, Job, JobResult, run_in_child, write_dataset

logger = logging.getLogger(__name__)

NAME = "scaling"
CONTENDERS = ("remote_predict", "remote_predict_arrow", "predict_batch_udf")
REMOTE_CONTENDERS = ("remote_predict", "remote_predict_arrow")
SHORT_NAMES = {**TARGET_NAMES, "predict_batch_udf": "predict_batch_udf"}
FILES_IN_SMALLEST = 4
"""The smallest size is this many files; a larger size is more files of the same rows."""
QUICK_SIZES = (8_192, 16_384)
"""The quick mode's sizes of tabular_mlp: the smallest and one larger size that the targets
compare with it, files of 2,048 rows."""
QUICK_LARGER_SIZES_BY = ("remote_predict",)
"""The contenders the quick mode runs at its larger size too; the others run the smallest only.
Each application costs the same whatever its size (a JVM, Python workers, a server or TensorFlow
in the workers: seconds of start for a second of rows), and every contender runs this module's
code alike at every size, so one contender at both sizes runs the comparison between sizes, and a
remote one runs both kinds of target (the workers' memory and the server's): four applications
instead of six."""
TARGET_SPEED_HOLD = 0.10
"""rows/s at the largest size at most this fraction under rows/s at the smallest. One-sided: a
larger job that runs faster has not lost scale, the smallest has spread its fixed costs (planning
the job, scheduling its tasks) over fewer rows; the ratio is reported either way."""
TARGET_MEMORY_GROWTH_MIB = 64.0
"""The largest size's memory peak at most this much over the smallest's. An absolute bound, not a
share: what grows with the rows is bytes held per row or per batch, whatever the process's size,
and 10% of a worker set holding TensorFlow (about 1.5 GiB) would let 150 MiB grow unnoticed. 64
MiB is a few batches in flight (a 16,384-row Arrow batch is 4 MiB of tabular and 32 MiB of
sequence input), and 16x the rows would cross it with 4.5 bytes kept per tabular row or 45 per
sequence row."""


@dataclass(frozen=True)
class Settings:
    quick: bool
    sizes: dict[str, tuple[int, ...]]
    """Rows of each size, smallest first, by model."""
    larger_sizes_by: tuple[str, ...] = CONTENDERS
    """The contenders that run the sizes beyond the smallest (every contender runs the smallest)."""

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick, {"tabular_mlp": QUICK_SIZES}, QUICK_LARGER_SIZES_BY)
        return cls(
            quick,
            {
                "tabular_mlp": (1_000_000, 4_000_000, 16_000_000),
                "sequence_bilstm": (100_000, 400_000, 1_600_000),
            },
        )

    def contenders_at(self, model: str, size: int) -> tuple[str, ...]:
        """The contenders that run ``model`` at ``size`` rows, in ``CONTENDERS``' order."""
        if size == self.sizes[model][0]:
            return CONTENDERS
        return tuple(c for c in CONTENDERS if c in self.larger_sizes_by)

    def rows_per_file(self, model: str) -> int:
        sizes = self.sizes[model]
        per_file = sizes[0] // FILES_IN_SMALLEST
        if any(size % per_file for size in sizes):
            raise ValueError(
                f"{model}: sizes {sizes} must be multiples of the smallest size's file "
                f"({per_file:,} rows, a {FILES_IN_SMALLEST}th of it)"
            )
        return per_file


@dataclass
class Point:
    """One application: a contender on one size of one model's data."""

    model: str
    contender: str
    rows_expected: int
    files: int
    job: JobResult
    server_peak_rss_mib: float | None
    """The peak of the fresh model server it called; None for the model in the worker."""

    @property
    def rows_s(self) -> float:
        return rows_per_s(self.job)


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the Spark runs are not sampled."""
    return measure(workspace, Settings.make(quick))


def measure(workspace: Workspace, settings: Settings) -> ComparisonResult:
    """The comparison at ``settings``' sizes (``run`` takes the full or the quick ones)."""
    started = time.perf_counter()
    points: list[Point] = []
    for model, sizes in settings.sizes.items():
        repository = workspace.repository(f"scaling-{model}", {model: {}})
        folders = write_sizes(workspace, model, sizes, settings.rows_per_file(model))
        for size in sizes:
            for contender in settings.contenders_at(model, size):
                points.append(
                    _measure(workspace, repository, model, contender, folders[size], size, sizes[0])
                )
    return _result(points, settings, time.perf_counter() - started)


def write_sizes(
    workspace: Workspace, model: str, sizes: tuple[int, ...], rows_per_file: int
) -> dict[int, Path]:
    """A folder per size: the largest written once in files of ``rows_per_file`` rows (ids in
    order), each size a folder of hard links to the first ``size / rows_per_file`` of them."""
    written = workspace.path(f"data-{model}")
    logger.info("scaling: writing %s rows of %s", f"{sizes[-1]:,}", model)
    write_dataset(written, model, sizes[-1], sizes[-1] // rows_per_file)
    files = sorted(written.glob("*.parquet"))
    folders = {}
    for size in sizes:
        folder = workspace.path(f"data-{model}-{size}")
        folder.mkdir()
        for file in files[: size // rows_per_file]:
            os.link(file, folder / file.name)
        folders[size] = folder
    return folders


def _measure(
    workspace: Workspace,
    repository: Path,
    model: str,
    contender: str,
    data: Path,
    rows: int,
    warmup_rows: int,
) -> Point:
    logger.info("scaling: %s on %s rows of %s", contender, f"{rows:,}", model)
    job = Job(
        contender=contender,
        model=model,
        data=str(data),
        model_file=str(repository / model / "1" / "model.keras"),
        marker_dir=str(workspace.path(f"loads-{model}-{contender}-{rows}")),
        runs=1,
        warmup_rows=warmup_rows,
        log_file=str(LOGS_DIR / f"scaling-{model}-{contender}-{rows}.log"),
    )
    files = sum(1 for _ in data.glob("*.parquet"))
    if contender not in REMOTE_CONTENDERS:
        return Point(model, contender, rows, files, run_in_child(job, timeout_s=3600), None)
    server = workspace.start_server(repository, f"scaling-{model}")
    try:
        process = psutil.Process(server.pid)
        with PeakRssSampler(lambda: [process], interval_s=0.2) as memory:
            result = run_in_child(
                replace(job, address=server.grpc_target(), server_pid=server.pid), timeout_s=3600
            )
    finally:
        workspace.stop_server(server)
    return Point(model, contender, rows, files, result, memory.peak_total_bytes / 2**20)


def _by_model(points: list[Point]) -> dict[str, dict[str, list[Point]]]:
    """model -> contender -> its points, smallest size first."""
    grouped: dict[str, dict[str, list[Point]]] = {}
    for point in points:
        grouped.setdefault(point.model, {}).setdefault(point.contender, []).append(point)
    for by_contender in grouped.values():
        for series in by_contender.values():
            series.sort(key=lambda p: p.rows_expected)
    return grouped


def _cpu_per_million(point: Point) -> str:
    cpu_s = point.job.runs_cpu_s[point.job.best_run]
    return " / ".join(
        f"{cpu_s.get(group, 0.0) / point.job.rows * 1e6:.2f}"
        for group in ("Python workers", "JVM", "model server")
    )


def _model_table(model: str, by_contender: dict[str, list[Point]]) -> Table:
    table = Table(
        f"{model}: {MODELS[model][1]} floats per row, local[2], noop sink; one timed run per application, "
        "after an untimed run of the smallest size's rows",
        [
            "contender",
            "rows",
            "files",
            "partitions",
            "rows/s",
            "÷ smallest",
            "warm-up s",
            "run s",
            "peak RSS, model server MiB",
            "peak RSS, all Python workers MiB",
            "peak RSS, one worker MiB",
            "peak RSS, JVM MiB",
            "CPU-s per million rows: workers / JVM / server",
        ],
    )
    for contender, series in by_contender.items():
        smallest = series[0].rows_s
        for point in series:
            table.rows.append(
                {
                    "contender": LABELS[contender],
                    "rows": point.job.rows,
                    "files": point.files,
                    "partitions": point.job.partitions,
                    "rows/s": point.rows_s,
                    "÷ smallest": point.rows_s / smallest,
                    "warm-up s": point.job.warmup_s,
                    "run s": point.job.runs_s[point.job.best_run],
                    "peak RSS, model server MiB": point.server_peak_rss_mib,
                    "peak RSS, all Python workers MiB": point.job.peak_worker_rss_total_mib,
                    "peak RSS, one worker MiB": point.job.peak_worker_rss_single_mib,
                    "peak RSS, JVM MiB": point.job.peak_jvm_rss_mib,
                    "CPU-s per million rows: workers / JVM / server": _cpu_per_million(point),
                }
            )
    return table


def _memory_target(
    model: str, contender: str, what: str, smallest: Point, largest: Point, mib: tuple[float, float]
) -> TargetCheck:
    growth = mib[1] - mib[0]
    return TargetCheck(
        f"{model}: {SHORT_NAMES[contender]}, peak RSS of {what} at {largest.rows_expected:,} rows at most "
        f"{TARGET_MEMORY_GROWTH_MIB:.0f} MiB over that at {smallest.rows_expected:,}",
        f"{growth:+,.0f} MiB ({mib[0]:,.0f} → {mib[1]:,.0f} MiB)",
        growth <= TARGET_MEMORY_GROWTH_MIB,
    )


def _targets(grouped: dict[str, dict[str, list[Point]]]) -> list[TargetCheck]:
    """Each contender's largest size against its smallest; one measured at one size compares nothing."""
    targets = []
    for model, all_contenders in grouped.items():
        by_contender = {contender: series for contender, series in all_contenders.items() if len(series) > 1}
        for contender, series in by_contender.items():
            smallest, largest = series[0], series[-1]
            ratio = largest.rows_s / smallest.rows_s
            targets.append(
                TargetCheck(
                    f"{model}: {SHORT_NAMES[contender]}, rows/s at {largest.rows_expected:,} rows at most "
                    f"{TARGET_SPEED_HOLD:.0%} under its rows/s at {smallest.rows_expected:,}",
                    f"{ratio:.2f}x ({smallest.rows_s:,.0f} → {largest.rows_s:,.0f} rows/s)",
                    ratio >= 1.0 - TARGET_SPEED_HOLD,
                )
            )
        for contender, series in by_contender.items():
            smallest, largest = series[0], series[-1]
            workers = (smallest.job.peak_worker_rss_total_mib, largest.job.peak_worker_rss_total_mib)
            targets.append(_memory_target(model, contender, "all Python workers", smallest, largest, workers))
            if smallest.server_peak_rss_mib is not None and largest.server_peak_rss_mib is not None:
                server = (smallest.server_peak_rss_mib, largest.server_peak_rss_mib)
                targets.append(
                    _memory_target(model, contender, "the model server", smallest, largest, server)
                )
    return targets


def _plot(grouped: dict[str, dict[str, list[Point]]], quick: bool) -> str:
    """Per model: rows/s against rows, and the memory peaks against rows, a line per contender."""
    panels: list[tuple[str, str, plots.Series]] = []
    for model, by_contender in grouped.items():
        speeds: dict[str, tuple[list[float], list[float]]] = {}
        memory: dict[str, tuple[list[float], list[float]]] = {}
        for contender, series in by_contender.items():
            rows = [float(p.rows_expected) for p in series]
            speeds[SHORT_NAMES[contender]] = (rows, [p.rows_s for p in series])
            memory[f"{SHORT_NAMES[contender]}: Python workers"] = (
                rows,
                [p.job.peak_worker_rss_total_mib for p in series],
            )
            servers = [p.server_peak_rss_mib for p in series]
            if all(s is not None for s in servers):
                memory[f"{SHORT_NAMES[contender]}: model server"] = (rows, [float(s or 0.0) for s in servers])
        panels.append((f"{model}: rows/s", "rows/s", speeds))
        panels.append((f"{model}: peak RSS", "MiB", memory))
    plot_file = f"{NAME}.png"
    plots.line_panels(
        results_dir(quick) / plot_file,
        "Scaling with the rows, local[2]",
        panels,
        xlabel="rows in the job (log)",
        x_tick_label=_short,
    )
    return plot_file


def _short(rows: float) -> str:
    """1600000 -> '1.6M', 20000 -> '20k'."""
    for unit, suffix in ((1_000_000, "M"), (1_000, "k")):
        if rows >= unit:
            return f"{rows / unit:g}{suffix}"
    return str(rows)


def _partition_note(grouped: dict[str, dict[str, list[Point]]]) -> str:
    parts = []
    for model, by_contender in grouped.items():
        series = max(by_contender.values(), key=len)  # the contender measured at every size
        layout = ", ".join(
            f"{p.rows_expected:,} rows: {p.files} files in {p.job.partitions} partitions" for p in series
        )
        parts.append(f"{model} ({layout})")
    return (
        "Partitions grow with the rows, at the same rows per partition: "
        + "; ".join(parts)
        + ". Spark packs files into partitions of up to `spark.sql.files.maxPartitionBytes` (128 MiB), so a "
        "job of 16x the rows has 16x the tasks of the same size, as a user's job that reads more files has. "
        "A fixed partition count would instead make each task 16x longer, which is not how Spark reads "
        "a larger input. (The quick mode's files are so small that Spark packs them more tightly.)"
    )


def _result(points: list[Point], settings: Settings, duration_s: float) -> ComparisonResult:
    grouped = _by_model(points)
    tables = [_model_table(model, by_contender) for model, by_contender in grouped.items()]
    sizes = "; ".join(
        f"{model} at {', '.join(f'{s:,}' for s in sizes)} rows" for model, sizes in settings.sizes.items()
    )
    count = {2: "two", 3: "three"}.get(len(next(iter(settings.sizes.values()))), "several")
    method = (
        f"The same Spark job at {count} sizes ({sizes}), through udfserve's `remote_predict` (pandas UDF and "
        "`udf_type='arrow'`) and Spark's `predict_batch_udf` (the model in the worker, batch_size 4,096). "
        "Every point is its own Spark application (local[2], Arrow batches of 16,384 rows, `noop` sink) and, "
        "for udfserve, its own model server started fresh for it (the example model, client defaults), so "
        "each memory peak is that of one job of that size. A model's largest data set is written once in "
        f"equal files ({FILES_IN_SMALLEST} files make the smallest size); a smaller size reads the first of "
        "those files. Before its timed run, each application sends the smallest size's rows (the first "
        "files, by `id`) through the same UDF, untimed (*warm-up s*): that run pays the Python workers' "
        "start, TensorFlow's import and the model's load in `predict_batch_udf`'s workers, and the server's "
        "first calls. Then one timed run of the whole size: at the smallest size it is the second run over "
        "the same rows, at the larger sizes the first over all of them, equally warm, so *rows/s* compares "
        "across sizes (one run per application: the largest take minutes, and a neighbour's burst shows as "
        "a dip at one size, not as a trend over all three). The resident memory is sampled over the whole "
        "application, warm-up included: every 50 ms for the `pyspark.daemon` process and the workers it "
        "forks (summed, and the largest one), every 0.2 s for the JVM and the model server. *÷ smallest*: "
        "rows/s over the same contender's rows/s at the smallest size. CPU seconds are those of the timed "
        "run, by process group. Targets: rows/s at the largest size at most "
        f"{TARGET_SPEED_HOLD:.0%} under the smallest's (only a drop counts: a larger job that runs "
        "faster has spread the fixed costs of a job, planning it and scheduling its tasks, over more "
        f"rows); peaks at the largest size at most {TARGET_MEMORY_GROWTH_MIB:.0f} MiB over the "
        "smallest's (an absolute bound: what grows with the rows is bytes kept per row or per batch, "
        "whatever the process's size; 64 MiB is a few batches in flight, and 16x the rows cross it with "
        "4.5 bytes kept per tabular row or 45 per sequence row, where 10% of `predict_batch_udf`'s "
        "1.5 GiB of workers would let 150 MiB grow unnoticed)."
    )
    notes = [
        _partition_note(grouped),
        "Everything shares two cores: the JVM, the Python workers and, for udfserve, the model server.",
    ]
    if settings.larger_sizes_by != CONTENDERS:
        notes.append(
            "Only " + ", ".join(SHORT_NAMES[c] for c in settings.larger_sizes_by) + " ran the sizes beyond "
            "the smallest (the quick mode, which checks that the script works); the other contenders ran the "
            "smallest size alone and have no targets."
        )
    return ComparisonResult(
        name=NAME,
        title="Scaling with the rows: 1x, 4x and 16x the job",
        method=method,
        tables=tables,
        targets=_targets(grouped),
        notes=notes,
        plot_file=_plot(grouped, settings.quick),
        raw={
            "points": [
                {
                    "model": p.model,
                    "contender": p.contender,
                    "rows_expected": p.rows_expected,
                    "files": p.files,
                    "rows_s": p.rows_s,
                    "server_peak_rss_mib": p.server_peak_rss_mib,
                    "job": asdict(p.job),
                }
                for p in points
            ],
        },
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
