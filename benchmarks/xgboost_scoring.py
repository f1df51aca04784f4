"""Comparison 14, gradient-boosted trees in Spark: udfserve's XGBoost backend through
``remote_predict``, against ``predict_batch_udf`` with xgboost in the Python workers, and against
XGBoost's own Spark estimator (``xgboost.spark``), whose ``transform`` its users call today.

    python -m benchmarks.xgboost_scoring [--quick]

The model is the XGBoost backend's example ``tabular_xgb`` (100 trees of depth 6 over 32 float
features, ``binary:logistic``), written by the function its registry entry names. The rows are
parquet files of an ``id`` and ``features`` (32 floats). Each contender runs in a fresh Spark
application (``benchmarks.xgboost_job``: local[2], its own driver, JVM and workers); the model
server is started once, before the first round, and serves every ``remote_predict`` job warm.

Before anything is timed the answers are checked: every contender's probabilities of the first 64
rows, in every application, against XGBoost's ``inplace_predict`` of the same rows in this
process, to 1e-6. The rounds run in ABBA order (A B C, then C B A, ...), so a contender runs first
as often as last. Per application: rows/s of the fastest run after the first (which pays the
workers' start), and the CPU seconds of that run per row, summed over the application's Python
workers and JVM and the model server. The ratios are medians over the rounds of each round's ratio.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.processes import LOGS_DIR, Workspace
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.xgboost_job import CONTENDERS, INPUT, MODEL, SAMPLE_ROWS, XgbJob, XgbJobResult, run_in_child

logger = logging.getLogger(__name__)

NAME = "xgboost_scoring"
UDFSERVE = "remote_predict"
BASELINES = ("xgboost.spark", "predict_batch_udf")
TOLERANCE = 1e-6


@dataclass(frozen=True)
class Settings:
    quick: bool
    rows: int
    rounds: int
    runs: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick, rows=4_096, rounds=1, runs=1)
        return cls(quick, rows=1_000_000, rounds=4, runs=2)


def write_features(path: Path, rows: int, features: int, files: int = 2, seed: int = 0) -> None:
    """``rows`` rows of an ``id`` and ``features`` floats in ``[-0.5, 0.5)``, in ``files`` files."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        count = min(per_file, rows - start)
        values = rng.uniform(-0.5, 0.5, size=count * features).astype(np.float32)
        offsets = np.arange(0, count * features + 1, features, dtype=np.int32)
        table = pa.table(
            {
                "id": pa.array(np.arange(start, start + count, dtype=np.int64)),
                INPUT: pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        pq.write_table(table, path / f"part-{index:03d}.parquet", row_group_size=16384)


def reference_answers(model_file: Path, data: Path) -> dict[str, float]:
    """XGBoost's own probabilities of the first ``SAMPLE_ROWS`` rows, in this process."""
    import xgboost

    table = pq.read_table(data, filters=[("id", "<", SAMPLE_ROWS)])
    features = np.stack(table.column(INPUT).to_pylist()).astype(np.float32)
    booster = xgboost.Booster()
    booster.load_model(str(model_file))
    answers = booster.inplace_predict(features)
    ids = table.column("id").to_pylist()
    return {str(row_id): float(answer) for row_id, answer in zip(ids, answers, strict=True)}


def difference(result: XgbJobResult, expected: dict[str, float]) -> float:
    """Max |Δ| of an application's sampled answers from XGBoost's; raises when a row is missing."""
    if set(result.sample) != set(expected):
        raise RuntimeError(
            f"{result.contender} answered ids {sorted(result.sample, key=int)[:5]}...; expected the "
            f"{len(expected)} first ids"
        )
    return max(abs(result.sample[key] - value) for key, value in expected.items())


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the contenders are measured, not sampled."""
    from udfserve.runtime.backends.xgboost.example import FEATURES, write_examples

    settings = Settings.make(quick)
    started = time.perf_counter()
    repository = workspace.path("repository")
    write_examples(repository)
    model_file = repository / MODEL / "1" / "model.ubj"
    data = workspace.path("data")
    write_features(data, settings.rows, FEATURES)
    expected = reference_answers(model_file, data)
    server = workspace.start_server(repository, "xgboost-scoring")
    rounds: dict[str, list[XgbJobResult]] = {contender: [] for contender in CONTENDERS}
    for round_index in range(settings.rounds):
        order = list(CONTENDERS if round_index % 2 == 0 else CONTENDERS[::-1])
        # a measure runs each contender in an application of its own; a quick run, all in one
        for contenders in [order] if settings.quick else [[contender] for contender in order]:
            logger.info("xgboost_scoring: round %d, %s, %d rows", round_index + 1, contenders, settings.rows)
            job = XgbJob(
                contenders=contenders,
                data=str(data),
                model_file=str(model_file),
                features=FEATURES,
                address=server.grpc_target(),
                server_pid=server.pid,
                runs=settings.runs,
                log_file=str(LOGS_DIR / f"xgboost-{'-'.join(contenders)}.log"),
            )
            for result in run_in_child(job):
                off = difference(result, expected)
                if off > TOLERANCE:
                    raise RuntimeError(
                        f"{result.contender} differs from XGBoost's inplace_predict by {off:.3g}; "
                        f"expected at most {TOLERANCE:g}: not benchmarking wrong answers"
                    )
                rounds[result.contender].append(result)
    workspace.stop_server(server)
    differences = {c: max(difference(r, expected) for r in rounds[c]) for c in CONTENDERS}
    return _result(rounds, differences, settings, time.perf_counter() - started)


# -- the report -------------------------------------------------------------------------------------
def rows_s(result: XgbJobResult) -> float:
    return result.rows / result.runs_s[result.best_run]


def cpu_us_per_row(result: XgbJobResult, group: str = "") -> float:
    """CPU µs per row of the quoted run: one process group's, or all of them summed."""
    spent = result.runs_cpu_s[result.best_run]
    seconds = spent.get(group, 0.0) if group else sum(spent.values())
    return seconds / max(result.rows, 1) * 1e6


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _ratio(
    rounds: dict[str, list[XgbJobResult]], mine: str, theirs: str, value: Callable[..., float]
) -> float:
    pairs = zip(rounds[mine], rounds[theirs], strict=True)
    return _median([value(a) / value(b) for a, b in pairs])


def _result(
    rounds: dict[str, list[XgbJobResult]],
    differences: dict[str, float],
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    count = settings.rounds
    answers = Table(
        "Answers, checked in every application: max |Δ| from XGBoost's inplace_predict, first "
        f"{SAMPLE_ROWS} rows",
        ["contender", "largest difference"],
        [{"contender": c, "largest difference": differences[c]} for c in CONTENDERS],
    )
    groups = ("Python workers", "JVM", "model server")
    columns = ["contender", "rows/s", *(f"÷ {b}" for b in BASELINES), "by round", "CPU µs/row"]
    columns += [f"CPU ÷ {b}" for b in BASELINES] + [f"{g} µs/row" for g in groups] + ["peak workers MiB"]
    spark = Table(
        f"Spark end to end: {settings.rows:,} rows of parquet, local[2], noop sink; median of {count} "
        "application(s) per contender",
        columns,
    )
    for contender in CONTENDERS:
        jobs = rounds[contender]
        row: dict[str, Any] = {
            "contender": contender,
            "rows/s": _median([rows_s(j) for j in jobs]),
            "by round": ", ".join(f"{rows_s(j):,.0f}" for j in jobs),
            "CPU µs/row": _median([cpu_us_per_row(j) for j in jobs]),
            "peak workers MiB": _median([j.peak_worker_rss_total_mib for j in jobs]),
        }
        for baseline in BASELINES:
            row[f"÷ {baseline}"] = _ratio(rounds, contender, baseline, rows_s)
            row[f"CPU ÷ {baseline}"] = _ratio(rounds, contender, baseline, cpu_us_per_row)
        for group in groups:
            row[f"{group} µs/row"] = _median([cpu_us_per_row(j, group) for j in jobs])
        spark.rows.append(row)
    worst = max(differences.values())
    targets = [
        TargetCheck(
            f"every contender answers what XGBoost's inplace_predict answers, to {TOLERANCE:g}",
            f"largest difference {worst:.2g} (first {SAMPLE_ROWS} rows of each application)",
            worst <= TOLERANCE,
        )
    ]
    plot_file = f"{NAME}.png"
    plots.bar_panels(
        results_dir(settings.quick) / plot_file,
        "XGBoost in Spark: tabular_xgb (median)",
        [
            ("Spark rows/s", "rows/s", {c: _median([rows_s(j) for j in rounds[c]]) for c in CONTENDERS}),
            ("CPU per row", "µs", {c: _median([cpu_us_per_row(j) for j in rounds[c]]) for c in CONTENDERS}),
        ],
    )
    return ComparisonResult(
        name=NAME,
        title="XGBoost in Spark: remote_predict, predict_batch_udf and xgboost.spark on tabular_xgb",
        method=_method(settings),
        tables=[answers, spark],
        targets=targets,
        notes=_notes(rounds),
        plot_file=plot_file,
        raw={"differences": differences, "rounds": {c: [asdict(j) for j in by] for c, by in rounds.items()}},
        duration_s=duration_s,
    )


def _method(settings: Settings) -> str:
    applications = "shared by the three (a quick run)" if settings.quick else "of its own per contender"
    return (
        "The XGBoost backend's example `tabular_xgb` (100 trees of depth 6, 32 float features, "
        "binary:logistic; `udfserve models generate --backend-examples xgboost`) scores "
        f"{settings.rows:,} rows of parquet (an `id` and a 32-float `features` array, two files) in a Spark "
        f"application {applications} "
        "(local[2], 4,096 rows per Arrow batch and per call), each "
        "as its users write it: **remote_predict**, udfserve's pandas UDF against one model server "
        "(started once before the rounds, the booster loaded and warmed up; its CPU counted with the "
        "application's); **predict_batch_udf**, Spark's own, the booster loaded once per Python worker and "
        "called with `Booster.inplace_predict` per batch, XGBoost's default threads; **xgboost.spark**, "
        "XGBoost's `SparkXGBClassifierModel.transform` of the same booster (loaded into an `XGBClassifier` "
        "and given the estimator's parameters, as `fit` does), which also computes the raw margins and the "
        "predicted class. Every application's first "
        f"{SAMPLE_ROWS} probabilities are checked against XGBoost's in the benchmark's process to "
        f"{TOLERANCE:g} before its figures count. {settings.rounds} round(s) in ABBA order, {settings.runs} "
        "run(s) per application into the `noop` sink; the quoted run is the fastest after the first "
        "(which pays the workers' start). *CPU µs/row* sums the Python workers', the JVM's and the model "
        "server's CPU seconds of that run; *÷* columns are medians over the rounds of each round's ratio."
    )


def _notes(rounds: dict[str, list[XgbJobResult]]) -> list[str]:
    notes = []
    for baseline in BASELINES:
        speed = _ratio(rounds, UDFSERVE, baseline, rows_s)
        cpu = _ratio(rounds, UDFSERVE, baseline, cpu_us_per_row)
        notes.append(
            f"remote_predict against {baseline}: {speed:.2f}x its rows/s, {cpu:.2f}x its CPU per row "
            "(medians of the rounds' ratios)."
        )
    return notes


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
