"""Comparison 7, the backends side by side: the tabular MLP served by TensorFlow (Keras), by ONNX
Runtime (its ONNX export) and by PyTorch (its ``torch.export`` program), the same seeded weights.

    python -m benchmarks.backends [--quick]

Each contender is a model server holding only its model, started with the same settings. Before
anything is timed, every contender's answers to the same rows are checked against TensorFlow's
to 1e-5: a benchmark of wrong answers is no benchmark. Then the contenders are measured in
interleaved rounds (A B C, B C A, C A B, ...) so that the machine's noise hits them alike; in
each round a contender's server is started cold (spawn to listening and to SERVING, the model's
load time from its metrics, resident memory once serving), loaded by the Spark client's stream
over the unix socket with its payloads in shared memory at 64 and at 1,024 rows per request
(resident memory after the load and its peak), and called by a Spark job through
``remote_predict`` (local[2], its own application); then it is stopped. Medians over the rounds
are quoted, with the median of each round's ratio to TensorFlow. A quick run (one round) checks
each contender's answers on its round's server instead, before that server's load, TensorFlow's
first: three server starts fewer, and a wrong answer still ends the run before any report.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.cold_start import server_cold_start
from benchmarks.load_client import LoadSpec, finish, make_batch, start_in_child
from benchmarks.processes import LOGS_DIR, PeakRssSampler, ProcessMeter, Workspace, metric_value, scrape
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.spark_e2e import rows_per_s
from benchmarks.spark_job import Job, JobResult, run_in_child, write_dataset
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch, encode_batch
from udfserve.services.model_server.launcher import ServerProcess, wait_until_serving

logger = logging.getLogger(__name__)

NAME = "backends"
REFERENCE = "TensorFlow"
CONTENDERS = {
    REFERENCE: "tabular_mlp",
    "ONNX Runtime": "tabular_mlp_onnx",
    "PyTorch": "tabular_mlp_torch",
}
"""Backend -> the example model it serves; all three compute the same function, same weights."""
GENERATE_FLAGS = ("--onnx", "--torch")
"""``udfserve models generate`` flags that write the ONNX and PyTorch exports."""
BATCH_ROWS = (64, 1024)
IN_FLIGHT = 4
"""Batches the load client holds unanswered (the Spark client's default ``max_in_flight``)."""
TOLERANCE = 1e-5
CHECK_ROWS = 1024
OUTPUT = "probabilities"


@dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int
    load_s: float
    spark_rows: int
    spark_runs: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick, rounds=1, load_s=0.5, spark_rows=8_192, spark_runs=1)
        return cls(quick, rounds=3, load_s=8.0, spark_rows=400_000, spark_runs=2)


@dataclass
class Round:
    """One contender's measurements in one round."""

    cold: dict[str, float]
    rss_serving_mib: float
    rss_after_load_mib: float
    peak_rss_mib: float
    load: dict[int, dict[str, float]] = field(default_factory=dict)
    """Rows per request -> rows/s, latency, server CPU, shared-memory requests."""
    spark: dict[str, Any] = field(default_factory=dict)


def predict(server: ServerProcess, model: str, rows: int) -> np.ndarray:
    """The server's ``probabilities`` for ``rows`` rows of the load client's seeded batch."""
    request = pb.PredictRequest(model=model, batch_id=1, arrow_ipc=encode_batch(make_batch(rows, seed=7)))
    with grpc.insecure_channel(server.grpc_target()) as channel:
        (response,) = list(pb_grpc.InferenceStub(channel).Predict(iter([request]), timeout=120))
    if response.HasField("error"):
        raise RuntimeError(f"model {model!r} answered an error: {response.error.message}")
    column = decode_batch(response.arrow_ipc).column(OUTPUT)
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False)).reshape(rows, -1)


def check_answers(workspace: Workspace, repositories: dict[str, Path]) -> dict[str, float]:
    """Max |Δ| of each contender's answers from TensorFlow's, on the same rows; raises past 1e-5."""
    answers = {}
    for backend, model in CONTENDERS.items():
        server = workspace.start_server(repositories[backend], f"backends-check-{model}", wait=False)
        wait_until_serving(server, timeout_s=180)
        answers[backend] = predict(server, model, CHECK_ROWS)
        workspace.stop_server(server)
    return {
        backend: checked_difference(backend, answer, answers[REFERENCE])
        for backend, answer in answers.items()
    }


def checked_difference(backend: str, answer: np.ndarray, reference: np.ndarray) -> float:
    """Max |Δ| of a contender's answers from TensorFlow's; raises past 1e-5 (or on another shape)."""
    if answer.shape != reference.shape:
        raise RuntimeError(
            f"{backend} answered {CHECK_ROWS} rows with shape {answer.shape}; expected TensorFlow's "
            f"{reference.shape}"
        )
    difference = float(np.max(np.abs(answer - reference)))
    if difference > TOLERANCE:
        raise RuntimeError(
            f"{backend} ({CONTENDERS[backend]}) differs from TensorFlow by up to "
            f"{difference:.3g}; expected at most {TOLERANCE:g}: not benchmarking wrong answers"
        )
    return difference


def measure_load(server: ServerProcess, model: str, rows: int, duration_s: float) -> dict[str, float]:
    """The Spark client's stream, shared memory on, for ``duration_s`` at ``rows`` per request."""
    spec = LoadSpec(
        target=server.grpc_target(prefer_unix=True),
        model=model,
        kind="client_shared_memory",
        rows=rows,
        streams=1,
        in_flight=IN_FLIGHT,
        duration_s=duration_s,
    )
    before = scrape(server)
    meter = ProcessMeter(server.pid)
    client = start_in_child(spec)
    meter.start()
    result = finish(client, spec)
    usage = meter.stop()
    after = scrape(server)
    shared = metric_value(after, "udfserve_shared_memory_requests_total") - metric_value(
        before, "udfserve_shared_memory_requests_total"
    )
    if shared < result.requests:
        raise RuntimeError(
            f"{model}: {shared:.0f} of {result.requests} requests at {rows} rows came through shared "
            "memory; expected all of them (is the shared-memory folder writable?)"
        )
    return {
        "rows_s": result.rows / result.wall_s,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "server_cpu": usage.utilisation,
        "server_cpu_us_per_row": usage.cpu_s / max(result.rows, 1) * 1e6,
        "requests": result.requests,
        "shared_memory_requests": shared,
    }


def measure_round(
    workspace: Workspace,
    backend: str,
    repository: Path,
    data: Path,
    settings: Settings,
    round_index: int,
    answers: dict[str, np.ndarray] | None = None,
) -> Round:
    """``answers``: where the contender's answers to the check rows are kept, asked of this
    round's server before its load (a quick run checks them here, TensorFlow's first)."""
    model = CONTENDERS[backend]
    cold, server = server_cold_start(
        workspace, repository, f"backends-{round_index}-{model}", model, (model,)
    )
    process = psutil.Process(server.pid)
    rss_serving = process.memory_info().rss / 2**20
    if answers is not None:
        answers[backend] = predict(server, model, CHECK_ROWS)
        checked_difference(backend, answers[backend], answers[REFERENCE])
    load = {}
    with PeakRssSampler(lambda: [process], interval_s=0.1) as sampler:
        for rows in BATCH_ROWS:
            logger.info("backends: round %d, %s, %d rows per request", round_index + 1, backend, rows)
            load[rows] = measure_load(server, model, rows, settings.load_s)
    rss_after = process.memory_info().rss / 2**20
    logger.info("backends: round %d, %s, Spark job of %d rows", round_index + 1, backend, settings.spark_rows)
    job = Job(
        contender="remote_predict",
        model=model,
        data=str(data),
        address=server.grpc_target(),
        server_pid=server.pid,
        runs=settings.spark_runs,
        log_file=str(LOGS_DIR / f"backends-spark-{model}.log"),
    )
    shared_before = metric_value(scrape(server), "udfserve_shared_memory_requests_total")
    result = run_in_child(job)
    shared = metric_value(scrape(server), "udfserve_shared_memory_requests_total") - shared_before
    workspace.stop_server(server)
    return Round(
        cold=cold,
        rss_serving_mib=rss_serving,
        rss_after_load_mib=rss_after,
        peak_rss_mib=sampler.peak_total_bytes / 2**20,
        load=load,
        spark={**asdict(result), "rows_s": rows_per_s(result), "shared_memory_requests": shared},
    )


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; the backends are measured, not sampled."""
    settings = Settings.make(quick)
    started = time.perf_counter()
    repositories = {
        backend: workspace.repository(f"repo-{model}", {model: {}}, GENERATE_FLAGS)
        for backend, model in CONTENDERS.items()
    }
    answers: dict[str, np.ndarray] | None = None
    differences: dict[str, float] = {}
    if settings.quick:
        # its one round's servers answer the check rows, each before its own load, TensorFlow's
        # first: three server starts fewer, and still no wrong answers reported
        logger.info("backends: checking each contender's answers against TensorFlow's in its round")
        answers = {}
    else:
        logger.info("backends: checking every contender's answers against TensorFlow's")
        differences = check_answers(workspace, repositories)
    data = workspace.path("data")
    write_dataset(data, "tabular_mlp", settings.spark_rows, files=2)
    rounds: dict[str, list[Round]] = {backend: [] for backend in CONTENDERS}
    order = list(CONTENDERS)
    for round_index in range(settings.rounds):
        # each round starts one contender later: every contender runs first, second and last
        shift = round_index % len(order)
        for backend in order[shift:] + order[:shift]:
            rounds[backend].append(
                measure_round(
                    workspace,
                    backend,
                    repositories[backend],
                    data,
                    settings,
                    round_index,
                    answers if round_index == 0 else None,
                )
            )
    if answers is not None:
        differences = {
            backend: checked_difference(backend, answer, answers[REFERENCE])
            for backend, answer in answers.items()
        }
    return _result(rounds, differences, settings, time.perf_counter() - started)


# -- the report -------------------------------------------------------------------------------------
def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _by_round(values: Sequence[float]) -> str:
    return ", ".join(f"{value:,.0f}" if value >= 100 else f"{value:.2f}" for value in values)


def _ratio(rounds: dict[str, list[Round]], backend: str, value: Callable[[Round], float]) -> float:
    """The median over rounds of the contender's value ÷ TensorFlow's in the same round."""
    pairs = zip(rounds[backend], rounds[REFERENCE], strict=True)
    return _median([value(mine) / value(theirs) for mine, theirs in pairs])


def _rows_s_at(rows: int) -> Callable[[Round], float]:
    """A round's server rows/s at ``rows`` rows per request."""
    return lambda measured: measured.load[rows]["rows_s"]


def _cpu_per_row_at(rows: int) -> Callable[[Round], float]:
    """A round's server CPU µs per row at ``rows`` rows per request: steadier than rows/s on a busy
    machine, since a neighbour's burst delays the server more than it adds to its work."""
    return lambda measured: measured.load[rows]["server_cpu_us_per_row"]


def _spark_difference(rounds: dict[str, list[Round]], backend: str) -> float:
    mine, theirs = rounds[backend][0].spark["sample"], rounds[REFERENCE][0].spark["sample"]
    shared = [key for key in mine if key in theirs]
    if not shared:
        return float("nan")
    return max(float(np.max(np.abs(np.asarray(mine[k]) - np.asarray(theirs[k])))) for k in shared)


def _result(
    rounds: dict[str, list[Round]], differences: dict[str, float], settings: Settings, duration_s: float
) -> ComparisonResult:
    count = settings.rounds
    answers = Table(
        "Answers, checked before timing: max |Δ| from TensorFlow's",
        ["backend", "model", f"server, {CHECK_ROWS:,} rows", "Spark job, first 64 rows"],
    )
    spark_differences = {backend: _spark_difference(rounds, backend) for backend in CONTENDERS}
    for backend, model in CONTENDERS.items():
        answers.rows.append(
            {
                "backend": backend,
                "model": model,
                f"server, {CHECK_ROWS:,} rows": differences[backend],
                "Spark job, first 64 rows": spark_differences[backend],
            }
        )
    throughput = Table(
        f"Server rows/s: the Spark client's stream, one connection, {IN_FLIGHT} batches in flight, unix "
        f"socket, payloads in shared memory; median of {count} round(s)",
        ["backend"]
        + [
            column
            for rows in BATCH_ROWS
            for column in (
                f"{rows:,} rows: rows/s",
                f"{rows:,}: ÷ TF",
                f"{rows:,}: by round",
                f"{rows:,}: p50 ms",
                f"{rows:,}: server CPU µs/row",
                f"{rows:,}: CPU/row ÷ TF",
            )
        ],
    )
    for backend in CONTENDERS:
        row: dict[str, Any] = {"backend": backend}
        for rows in BATCH_ROWS:
            cells = [r.load[rows] for r in rounds[backend]]
            row[f"{rows:,} rows: rows/s"] = _median([c["rows_s"] for c in cells])
            row[f"{rows:,}: ÷ TF"] = _ratio(rounds, backend, _rows_s_at(rows))
            row[f"{rows:,}: by round"] = _by_round([c["rows_s"] for c in cells])
            row[f"{rows:,}: p50 ms"] = _median([c["p50_ms"] for c in cells])
            row[f"{rows:,}: server CPU µs/row"] = _median([c["server_cpu_us_per_row"] for c in cells])
            row[f"{rows:,}: CPU/row ÷ TF"] = _ratio(rounds, backend, _cpu_per_row_at(rows))
        throughput.rows.append(row)
    memory = Table(
        f"Server resident memory (MiB), median of {count} round(s)",
        ["backend", "once serving", "÷ TF", "after the load", "÷ TF ", "peak during the load"],
    )
    for backend in CONTENDERS:
        memory.rows.append(
            {
                "backend": backend,
                "once serving": _median([r.rss_serving_mib for r in rounds[backend]]),
                "÷ TF": _ratio(rounds, backend, lambda r: r.rss_serving_mib),
                "after the load": _median([r.rss_after_load_mib for r in rounds[backend]]),
                "÷ TF ": _ratio(rounds, backend, lambda r: r.rss_after_load_mib),
                "peak during the load": _median([r.peak_rss_mib for r in rounds[backend]]),
            }
        )
    cold = Table(
        f"Cold start (s), median of {count} start(s)",
        [
            "backend",
            "spawn → listening",
            "spawn → serving",
            "÷ TF",
            "model load (framework import, warm-up included)",
            "÷ TF ",
            "first request ms (1,024 rows, new channel)",
        ],
    )
    for backend in CONTENDERS:
        runs = [r.cold for r in rounds[backend]]
        cold.rows.append(
            {
                "backend": backend,
                "spawn → listening": _median([c["listening_s"] for c in runs]),
                "spawn → serving": _median([c["serving_s"] for c in runs]),
                "÷ TF": _ratio(rounds, backend, lambda r: r.cold["serving_s"]),
                "model load (framework import, warm-up included)": _median(
                    [c["model_loads_s"] for c in runs]
                ),
                "÷ TF ": _ratio(rounds, backend, lambda r: r.cold["model_loads_s"]),
                "first request ms (1,024 rows, new channel)": _median([c["first_request_ms"] for c in runs]),
            }
        )
    spark = Table(
        f"Spark end to end: remote_predict over {settings.spark_rows:,} rows, local[2], noop sink; "
        f"median of {count} application(s)",
        ["backend", "rows/s", "÷ TF", "by round", "server CPU s per run", "requests via shared memory"],
    )
    for backend in CONTENDERS:
        jobs = [r.spark for r in rounds[backend]]
        spark.rows.append(
            {
                "backend": backend,
                "rows/s": _median([j["rows_s"] for j in jobs]),
                "÷ TF": _ratio(rounds, backend, lambda r: r.spark["rows_s"]),
                "by round": _by_round([j["rows_s"] for j in jobs]),
                "server CPU s per run": _median(
                    [j["runs_cpu_s"][JobResult(**_job_fields(j)).best_run]["model server"] for j in jobs]
                ),
                "requests via shared memory": _median([j["shared_memory_requests"] for j in jobs]),
            }
        )
    worst = max(max(differences.values()), *(d for d in spark_differences.values() if d == d))
    targets = [
        TargetCheck(
            f"every backend answers what TensorFlow answers, to {TOLERANCE:g}",
            f"max |Δ| {worst:.2g} (server, {CHECK_ROWS:,} rows; Spark, 64 rows)",
            worst <= TOLERANCE,
        )
    ]
    plot_file = f"{NAME}.png"
    plots.bar_panels(
        results_dir(settings.quick) / plot_file,
        "Backends side by side: tabular MLP (median)",
        [
            *(
                (
                    f"server rows/s, {rows:,} rows per request",
                    "rows/s",
                    {b: _median([r.load[rows]["rows_s"] for r in rounds[b]]) for b in CONTENDERS},
                )
                for rows in BATCH_ROWS
            ),
            (
                "Spark rows/s",
                "rows/s",
                {b: _median([r.spark["rows_s"] for r in rounds[b]]) for b in CONTENDERS},
            ),
            (
                "server resident memory after the load",
                "MiB",
                {b: _median([r.rss_after_load_mib for r in rounds[b]]) for b in CONTENDERS},
            ),
            (
                "spawn to SERVING",
                "s",
                {b: _median([r.cold["serving_s"] for r in rounds[b]]) for b in CONTENDERS},
            ),
        ],
    )
    method = (
        "Three model servers, one at a time, each holding one model and started with the same settings: "
        "`tabular_mlp` (Keras, TensorFlow backend), `tabular_mlp_onnx` (`udfserve models generate --onnx`, "
        "ONNX Runtime) and `tabular_mlp_torch` (`--torch`, PyTorch, `model.pt2`), the same seeded weights "
        "(64 float inputs, 256-256-8 dense layers, softmax); the same `config.yaml` (max_batch_size 4,096, "
        "a queue delay of 2 ms) and each backend's default thread settings. "
        + (
            f"Each contender's server of the round answers the same {CHECK_ROWS:,} rows before its load "
            f"(TensorFlow's first), and the answers are checked against TensorFlow's to {TOLERANCE:g}. "
            if settings.quick
            else f"Before anything is timed, each server answers the same {CHECK_ROWS:,} rows and the "
            f"answers are checked against TensorFlow's to {TOLERANCE:g}. "
        )
        + f"Then {count} round(s); each starts one contender later (A B C, B C A, C A B) so a "
        "neighbour's burst does not always land on the same one. In a round a contender's server is "
        "spawned (the clock starts just before; *serving* is the health service's SERVING, the model "
        "loaded and warmed up; the model's load time is the server's "
        "`udfserve_model_load_duration_seconds`, which includes importing the framework), its resident "
        "memory read, then loaded for "
        f"{settings.load_s:g} s at 64 and at 1,024 rows per request by the Spark client's own stream "
        f"(`PredictStream`: one connection, {IN_FLIGHT} batches in flight, unix socket, payloads in shared "
        "memory, every request counted by the server as read from shared memory) in a process of its own, "
        "then called by a Spark application (local[2], its own driver, JVM and workers) running "
        f"`remote_predict` with the client's defaults over {settings.spark_rows:,} rows of parquet into the "
        f"`noop` sink, {settings.spark_runs} time(s), the last run quoted (the first pays the workers' "
        "start). *÷ TF* is the median over the rounds of the ratio to TensorFlow's figure in the same round."
    )
    notes = _notes(rounds)
    return ComparisonResult(
        name=NAME,
        title="Backends side by side: TensorFlow, ONNX Runtime, PyTorch on the tabular MLP",
        method=method,
        tables=[answers, throughput, memory, cold, spark],
        targets=targets,
        notes=notes,
        plot_file=plot_file,
        raw={
            "answers_max_difference": differences,
            "spark_max_difference": spark_differences,
            "rounds": {backend: [asdict(r) for r in by] for backend, by in rounds.items()},
        },
        duration_s=duration_s,
    )


def _job_fields(job: dict[str, Any]) -> dict[str, Any]:
    """A ``JobResult``'s fields out of the dict a round keeps (which adds rows/s and the server's
    shared-memory count)."""
    return {key: value for key, value in job.items() if key in JobResult.__dataclass_fields__}


def _notes(rounds: dict[str, list[Round]]) -> list[str]:
    """The fastest and leanest contender at each measure, as this run saw them."""

    def best(label: str, value: Callable[[Round], float], higher: bool, unit: str) -> str:
        medians = {b: _median([value(r) for r in rounds[b]]) for b in CONTENDERS}
        winner = (max if higher else min)(medians, key=lambda b: medians[b])
        others = ", ".join(
            f"{b} {medians[b]:,.{0 if medians[b] >= 100 else 2}f}" for b in medians if b != winner
        )
        return (
            f"{label}: {winner} ({medians[winner]:,.{0 if medians[winner] >= 100 else 2}f} {unit}; {others})."
        )

    return [
        *(
            best(f"Server at {rows:,} rows per request", _rows_s_at(rows), True, "rows/s")
            for rows in BATCH_ROWS
        ),
        *(
            best(f"Least server CPU per row at {rows:,} rows per request", _cpu_per_row_at(rows), False, "µs")
            for rows in BATCH_ROWS
        ),
        best("Spark end to end", lambda r: r.spark["rows_s"], True, "rows/s"),
        best("Least resident memory after the load", lambda r: r.rss_after_load_mib, False, "MiB"),
        best("Soonest serving", lambda r: r.cold["serving_s"], False, "s"),
    ]


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
