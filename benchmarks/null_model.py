"""The serving path's own cost: every Spark path through udfserve on a model that does no
arithmetic, each beside the same kind of UDF doing the model's work in the worker with no server.

    python -m benchmarks.null_model [--quick]

On a GPU node the model's arithmetic leaves the host; what stays on its CPU is the serving path
(Spark's hand-off to its Python workers, Arrow, the transport, the server's decode, batching and
encode), and for small and medium models that path bounds the node's rows per second. A null
model (``benchmarks.null_models``: an ONNX ``Slice``) leaves only that path to measure, and its
model-less floor (the slice in the worker: a pandas UDF for the pandas path, an ``arrow_udf`` for
``remote_predict(udf_type='arrow')``, ``mapInArrow`` for ``predict_arrow``, a ``mapInArrow``
reading the files with pyarrow for ``predict_files``) is what Spark's own hand-off to Python
costs. The ratio of the two is what the serving path keeps of it.

One model server (the project's launcher: unix socket, shared memory as the client's defaults)
and one Spark application (``benchmarks.null_model_job``: local[2], a cached DataFrame, a
``noop`` sink) run every contender in rounds of alternating order. The full run scores 2,000,000
rows (``null_wide`` 1/16 of them); ``UDFSERVE_NULL_MODEL_ROWS`` sets another count.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.null_model_job import FLOOR_OF, FLOORS, GROUPS, ORDER, PATHS, READS_FILES
from benchmarks.null_models import NULL_MODELS, NullModel, write_dataset, write_repository
from benchmarks.processes import LOGS_DIR, Workspace, run_json_child
from benchmarks.report import ComparisonResult, Table, TargetCheck

logger = logging.getLogger(__name__)

NAME = "null_model"
LABELS = {
    "remote_predict": "remote_predict (pandas UDF)",
    "remote_predict_arrow": "remote_predict, udf_type='arrow'",
    "predict_arrow": "predict_arrow (mapInArrow)",
    "predict_files": "predict_files (pyarrow reads in the workers)",
    "pandas_udf": "floor: pandas UDF, slice in the worker",
    "arrow_udf": "floor: arrow_udf, slice in the worker",
    "map_in_arrow": "floor: mapInArrow, slice in the worker",
    "map_in_arrow_files": "floor: mapInArrow, pyarrow reads + slice in the worker",
}
TARGET_NAMES = {
    "remote_predict": "remote_predict",
    "remote_predict_arrow": "remote_predict(udf_type='arrow')",
    "predict_arrow": "predict_arrow",
    "predict_files": "predict_files",
}
TARGET_OF_FLOOR = 0.8
"""Each path at least this share of its floor's rows/s (issue #40's targets)."""
TARGET_SERVER_SHARE = 0.25
"""The server's CPU per row at most this share of the Python workers' CPU per row."""
BATCH_ROWS = 16_384
"""Spark's Arrow batches, the files' row groups and pyarrow's reads: 16,384 rows."""
BYTES_PER_REQUEST = 16 << 20
"""16 MiB a request: ``null_slice``'s 16,384-row batches go whole (4 MiB of input), ``null_wide``'s
in four requests of 4,096 rows."""
WIDE_ROWS_DIVISOR = 16
"""``null_wide`` scores 1/16 of the rows: its rows are 16 times as wide, so the same bytes."""


@dataclass(frozen=True)
class Settings:
    rows: int
    files: int
    rounds: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(rows=int(os.environ.get("UDFSERVE_NULL_MODEL_ROWS", 4 * 4096)), files=2, rounds=1)
        return cls(rows=int(os.environ.get("UDFSERVE_NULL_MODEL_ROWS", 2_000_000)), files=4, rounds=2)

    def rows_of(self, model: NullModel) -> int:
        return self.rows if model.width <= 64 else max(self.rows // WIDE_ROWS_DIVISOR, 2 * self.files)


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the Spark runs are not sampled."""
    settings = Settings.make(quick)
    started = time.perf_counter()
    repository = write_repository(workspace.path("null-models"), max_batch_size=BATCH_ROWS)
    server = workspace.start_server(repository, "null-model")
    models = {}
    for name, model in NULL_MODELS.items():
        folder, small = workspace.path(f"data-{name}"), workspace.path(f"small-{name}")
        write_dataset(folder, model, settings.rows_of(model), settings.files, BATCH_ROWS)
        write_dataset(small, model, 2 * settings.files * 1024, settings.files, 1024)
        models[name] = {"folder": str(folder), "small": str(small)}
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    job = {
        "models": models,
        "address": server.grpc_target(),
        "server_pid": server.pid,
        "contenders": list(ORDER),
        "rounds": settings.rounds,
        "warm_up": settings.rounds > 1,  # quick mode: its one round pays the start
        "batch_rows": BATCH_ROWS,
        "rows_per_request": BATCH_ROWS,
        "bytes_per_request": BYTES_PER_REQUEST,
    }
    logger.info("null model: %s rows, %d round(s)", f"{settings.rows:,}", settings.rounds)
    measured = run_json_child(
        "benchmarks.null_model_job",
        job,
        str(LOGS_DIR / "null-model-spark.log"),
        "the null-model Spark application",
        {},
        timeout_s=3600,
    )["models"]
    file_bytes = {
        name: sum(p.stat().st_size for p in Path(m["folder"]).glob("*.parquet")) for name, m in models.items()
    }
    workspace.stop_server(server)
    return _result(measured, file_bytes, settings, quick, time.perf_counter() - started)


def best_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's fastest round: the one least disturbed by other work on the machine."""
    return min(runs, key=lambda run: run["seconds"])


def rows_s(measured: dict[str, Any], contender: str) -> float:
    return float(measured["rows"] / best_run(measured["contenders"][contender]["runs"])["seconds"])


def cpu_per_million(measured: dict[str, Any], contender: str) -> dict[str, float]:
    run = best_run(measured["contenders"][contender]["runs"])
    return {group: run["cpu_s"].get(group, 0.0) / measured["rows"] * 1e6 for group in GROUPS}


def payload_bytes(model: NullModel, contender: str, file_bytes_per_row: float) -> dict[str, float]:
    """Bytes per row each path moves, counted from the schema (Arrow's 4-byte list offsets and the
    8-byte ``id`` included; validity bitmaps left out): JVM to worker, worker to JVM, to and from
    the server, and parquet read in the worker."""
    features, prediction, row_id = model.input_bytes_per_row + 4, model.output_bytes_per_row + 4, 8
    if contender in ("remote_predict", "remote_predict_arrow", "pandas_udf", "arrow_udf"):
        # a scalar UDF: only its argument goes to the worker, only its answer comes back
        hand_off = (features, prediction)
    elif contender in ("predict_arrow", "map_in_arrow"):
        # mapInArrow: the whole row goes, the whole row and the answer come back
        hand_off = (row_id + features, row_id + features + prediction)
    else:
        hand_off = (0, row_id + prediction)
    server = model.input_bytes_per_row + model.output_bytes_per_row if contender in PATHS else 0
    read = file_bytes_per_row if contender in READS_FILES else 0.0
    return {
        "JVM → worker": hand_off[0],
        "worker → JVM": hand_off[1],
        "worker ⇄ server": server,
        "parquet read": read,
    }


def _tables(measured: dict[str, Any], file_bytes: dict[str, int], settings: Settings) -> list[Table]:
    rates = Table(
        "rows/s of each path and its floor (the fastest round), and the path's share of its floor",
        [
            "model",
            "contender",
            "rows",
            "rows checked",
            "tasks",
            "rows/s",
            "rows/s by round",
            "÷ floor",
            "÷ floor by round",
            "max |Δ| vs input",
        ],
    )
    cpu = Table(
        "CPU seconds per million rows by process, in the run quoted (two cores: at most 2 CPU-s a second; "
        "*cores busy* well under 2 means the run waited on other work of the machine)",
        ["model", "contender", *GROUPS, "total", "total ÷ floor's", "server ÷ workers", "cores busy"],
    )
    bytes_table = Table(
        "payload bytes per row, counted from the schema (Arrow's list offsets and the id included)",
        ["model", "contender", "JVM → worker", "worker → JVM", "worker ⇄ server", "parquet read"],
    )
    for name, by_model in measured.items():
        model = NULL_MODELS[name]
        for contender in ORDER:
            result = by_model["contenders"][contender]
            floor = FLOOR_OF.get(contender)
            by_round = [by_model["rows"] / run["seconds"] for run in result["runs"]]
            floor_runs = by_model["contenders"][floor]["runs"] if floor else []
            floor_rounds = [by_model["rows"] / run["seconds"] for run in floor_runs]
            rates.rows.append(
                {
                    "model": name,
                    "contender": LABELS[contender],
                    "rows": by_model["rows"],
                    "rows checked": result["checked_rows"],
                    "tasks": result["tasks"],
                    "rows/s": rows_s(by_model, contender),
                    "rows/s by round": " / ".join(f"{r:,.0f}" for r in by_round),
                    "÷ floor": rows_s(by_model, contender) / rows_s(by_model, floor) if floor else None,
                    "÷ floor by round": " / ".join(
                        f"{a / b:.2f}" for a, b in zip(by_round, floor_rounds, strict=False)
                    )
                    or "-",
                    "max |Δ| vs input": result["max_abs_difference"],
                }
            )
            per_million = cpu_per_million(by_model, contender)
            run = best_run(result["runs"])
            cpu.rows.append(
                {
                    "model": name,
                    "contender": LABELS[contender],
                    **per_million,
                    "total": sum(per_million.values()),
                    "total ÷ floor's": sum(per_million.values())
                    / sum(cpu_per_million(by_model, floor).values())
                    if floor
                    else None,
                    "server ÷ workers": per_million["model server"] / per_million["Python workers"]
                    if contender in PATHS
                    else None,
                    "cores busy": sum(run["cpu_s"].values()) / run["seconds"],
                }
            )
            bytes_table.rows.append(
                {
                    "model": name,
                    "contender": LABELS[contender],
                    **payload_bytes(model, contender, file_bytes[name] / by_model["rows"]),
                }
            )
    return [rates, cpu, bytes_table]


def _targets(measured: dict[str, Any]) -> list[TargetCheck]:
    targets = []
    for name, by_model in measured.items():
        for contender in PATHS:
            floor = FLOOR_OF[contender]
            ratio = rows_s(by_model, contender) / rows_s(by_model, floor)
            targets.append(
                TargetCheck(
                    f"{name}: {TARGET_NAMES[contender]} at least {TARGET_OF_FLOOR}x the rows/s of its "
                    f"floor ({LABELS[floor].removeprefix('floor: ')})",
                    f"{ratio:.2f}x ({rows_s(by_model, contender):,.0f} vs "
                    f"{rows_s(by_model, floor):,.0f} rows/s)",
                    ratio >= TARGET_OF_FLOOR,
                )
            )
    slice_model = measured.get("null_slice")
    if slice_model:
        for contender in PATHS:
            per_million = cpu_per_million(slice_model, contender)
            share = per_million["model server"] / per_million["Python workers"]
            targets.append(
                TargetCheck(
                    f"null_slice, 16,384-row requests through shared memory: {TARGET_NAMES[contender]}'s "
                    f"server CPU per row at most {TARGET_SERVER_SHARE} of its Python workers' CPU per row",
                    f"{share:.2f} ({per_million['model server']:.2f} vs {per_million['Python workers']:.2f} "
                    "CPU-s per million rows)",
                    share <= TARGET_SERVER_SHARE,
                )
            )
    return targets


def _result(
    measured: dict[str, Any], file_bytes: dict[str, int], settings: Settings, quick: bool, duration_s: float
) -> ComparisonResult:
    plot_file = f"{NAME}.png"
    panels = [
        (
            f"{name}: rows/s",
            "rows/s",
            {LABELS[c].split(" (")[0].removeprefix("floor: "): rows_s(m, c) for c in ORDER},
        )
        for name, m in measured.items()
    ]
    plots.bar_panels(
        results_dir(quick) / plot_file, "A null model: udfserve's paths and their floors, local[2]", panels
    )
    rows = ", ".join(f"{name} {m['rows']:,} rows" for name, m in measured.items())
    method = (
        "Two ONNX models that do no arithmetic (`benchmarks/null_models.py`): `null_slice` returns the "
        "first 8 of 64 float32 columns, `null_wide` all 1,024 of its columns (one `Slice` each). One "
        "model server (the project's launcher; the client's defaults: unix socket, payloads in shared "
        f"memory; `max_batch_size` {BATCH_ROWS:,}) and one Spark application (local[2], Arrow batches of "
        f"{BATCH_ROWS:,} rows, a cached DataFrame per model: {rows}; `null_wide` has "
        f"1/{WIDE_ROWS_DIVISOR} of the rows, the same bytes) run each udfserve path beside its floor, "
        "the same kind of UDF doing the slice in the worker with no server: a pandas UDF for "
        "`remote_predict`, an `arrow_udf` for `remote_predict(udf_type='arrow')` (which is one), "
        "`mapInArrow` for `predict_arrow`, and for `predict_files` (which reads the "
        f"parquet files, {settings.files} of {BATCH_ROWS:,}-row groups, with pyarrow in its workers) a "
        "`mapInArrow` reading the same files with pyarrow and slicing. The client asks for "
        f"{BATCH_ROWS:,} rows and at most {BYTES_PER_REQUEST >> 20} MiB a request (`null_slice`: whole "
        "16,384-row batches; `null_wide`: 4,096 rows) with 4 in flight, `fallback='error'`. "
        + (
            "Every contender first runs once, untimed, over a small data set (the workers' start, the "
            "client's connection); then "
            if settings.rounds > 1
            else "No untimed run (quick mode: the round pays the workers' start); "
        )
        + f"{settings.rounds} round(s) in alternating order (a path next to its floor, A B B A), each job "
        "writing to the `noop` sink. rows/s is the fastest round's; *÷ floor by round* compares each round's "
        "runs. CPU seconds are read with psutil from the JVM, the Python workers (`pyspark.daemon` and the "
        "workers it forks) and the server over the run quoted. After the rounds every answer is checked, "
        "untimed: *rows checked* counts its rows (each id once), and *max |Δ| vs input* compares the first "
        "64 rows' predictions with their inputs' first values."
    )
    notes = [
        "Everything shares two cores: the JVM, the Python workers and, for udfserve's paths, the server. "
        "A floor's cores go to Spark and its workers only; a path's share its workers' time with the "
        "server's.",
        "Payload bytes are counted from the data's widths, not measured: a scalar UDF (pandas or Arrow) "
        "receives only its argument and returns only its answer, `mapInArrow` receives the whole row and "
        "returns it with the answer, `predict_files` and its floor read the parquet files in the worker and "
        "return only the `id` and the answer; udfserve's paths also write the input to shared memory and "
        "read the answer from it.",
    ]
    return ComparisonResult(
        name=NAME,
        title="A null model: the serving path's own cost",
        method=method,
        tables=_tables(measured, file_bytes, settings),
        targets=_targets(measured),
        notes=notes,
        plot_file=plot_file,
        raw={"models": measured, "file_bytes": file_bytes, "floors": list(FLOORS)},
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
