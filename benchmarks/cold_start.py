"""Comparison 5, cold start: a model server from start to ready and its first answer; next to
what a fresh Python worker pays before its first prediction, in-process and through a server.

    python -m benchmarks.cold_start [--quick]

Server: the time from spawning ``udfserve serve`` to its ready file (listening) and to the
health service's SERVING (every model loaded and warmed up), the load time of each model (from
the server's metrics), the latency of the first request on a new channel and the median of the
requests after it. Worker: fresh interpreters (``benchmarks.startup_probe``) that import
TensorFlow and load the model, or import the client stack and call the running server.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

from benchmarks import plots
from benchmarks.cli import main_for, results_dir
from benchmarks.processes import Workspace, metric_value, scrape
from benchmarks.report import ComparisonResult, Table
from benchmarks.startup_probe import probe_in_child
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import encode_batch
from udfserve.services.model_server.launcher import ServerProcess, wait_until_serving

logger = logging.getLogger(__name__)

NAME = "cold_start"
MODEL = "tabular_mlp"
ROWS = 1024
STEADY_REQUESTS = 20
REPOSITORIES = {
    "tabular_mlp only": ("tabular_mlp",),
    "all three example models": ("tabular_mlp", "sequence_bilstm", "multi_io"),
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    repeats: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        return cls(quick, repeats=1 if quick else 3)


def _request(model: str = MODEL) -> pb.PredictRequest:
    values = np.random.default_rng(0).standard_normal(ROWS * 64, dtype=np.float32)
    offsets = np.arange(0, ROWS * 64 + 1, 64, dtype=np.int32)
    batch = pa.record_batch({"features": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    return pb.PredictRequest(model=model, batch_id=1, arrow_ipc=encode_batch(batch))


def _call(stub: pb_grpc.InferenceStub, request: pb.PredictRequest) -> float:
    started = time.perf_counter()
    for response in stub.Predict(iter([request]), timeout=60):
        if response.HasField("error"):
            raise RuntimeError(f"model {request.model!r}: {response.error.message}")
    return time.perf_counter() - started


def server_cold_start(
    workspace: Workspace,
    repository: Path,
    label: str,
    model: str = MODEL,
    loaded: Sequence[str] = REPOSITORIES["all three example models"],
) -> tuple[dict[str, float], ServerProcess]:
    """Start a server, time it to listening, to serving and its first requests of ``model``
    (``loaded``: the models whose load times are summed); leaves it running."""
    started = time.perf_counter()
    server = workspace.start_server(repository, label, wait=False)
    while not server.ready_file.exists():
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server {label} exited with code {server.process.poll()}: {server.log_tail()}"
            )
        time.sleep(0.005)
    listening_s = time.perf_counter() - started
    wait_until_serving(server, timeout_s=180)
    serving_s = time.perf_counter() - started
    metrics = scrape(server)
    loads = {
        name: metric_value(metrics, "udfserve_model_load_duration_seconds", model=name) for name in loaded
    }
    request = _request(model)
    with grpc.insecure_channel(server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        first_s = _call(stub, request)
        steady = [_call(stub, request) for _ in range(STEADY_REQUESTS)]
    return {
        "listening_s": listening_s,
        "serving_s": serving_s,
        "model_loads_s": sum(loads.values()),
        "first_request_ms": first_s * 1e3,
        "steady_request_ms": statistics.median(steady) * 1e3,
    }, server


def run(workspace: Workspace, quick: bool = False, profile: bool = False) -> ComparisonResult:
    """``profile`` is accepted for a common signature; start-up is measured, not sampled."""
    settings = Settings.make(quick)
    started = time.perf_counter()
    server_runs: dict[str, list[dict[str, float]]] = {label: [] for label in REPOSITORIES}
    worker_runs: dict[str, list[dict[str, Any]]] = {
        "in-process TensorFlow": [],
        "remote (udfserve client)": [],
    }
    repositories = {
        label: workspace.repository(label.split()[0], {model: {} for model in models})
        for label, models in REPOSITORIES.items()
    }
    model_file = repositories["tabular_mlp only"] / MODEL / "1" / "model.keras"
    for repeat in range(settings.repeats):
        for label, repository in repositories.items():
            logger.info("cold start: server with %s, run %d", label, repeat + 1)
            measured, server = server_cold_start(workspace, repository, f"cold-{repeat}-{label.split()[0]}")
            server_runs[label].append(measured)
            if label == "tabular_mlp only":
                logger.info("cold start: fresh workers, run %d", repeat + 1)
                worker_runs["remote (udfserve client)"].append(
                    probe_in_child(["remote", "--target", server.grpc_target(), "--rows", str(ROWS)])
                )
                worker_runs["in-process TensorFlow"].append(
                    probe_in_child(["inprocess", "--model-file", str(model_file), "--rows", str(ROWS)])
                )
            workspace.stop_server(server)
    return _result(server_runs, worker_runs, settings, time.perf_counter() - started)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(run[key]) for run in runs))


def _spread(runs: list[dict[str, Any]], key: str) -> str:
    values = [float(run[key]) for run in runs]
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _result(
    server_runs: dict[str, list[dict[str, float]]],
    worker_runs: dict[str, list[dict[str, Any]]],
    settings: Settings,
    duration_s: float,
) -> ComparisonResult:
    server_table = Table(
        f"Model server: start to ready, median (min-max) of {settings.repeats} start(s)",
        [
            "repository",
            "spawn → listening s",
            "spawn → serving s",
            "model loads s (TensorFlow import included)",
            f"first request ms ({ROWS} rows, new channel)",
            "next requests, median ms",
        ],
    )
    for label, runs in server_runs.items():
        server_table.rows.append(
            {
                "repository": label,
                "spawn → listening s": _spread(runs, "listening_s"),
                "spawn → serving s": _spread(runs, "serving_s"),
                "model loads s (TensorFlow import included)": _spread(runs, "model_loads_s"),
                f"first request ms ({ROWS} rows, new channel)": _spread(runs, "first_request_ms"),
                "next requests, median ms": _spread(runs, "steady_request_ms"),
            }
        )
    worker_table = Table(
        f"A fresh Python worker to its first prediction of {ROWS} rows (tabular_mlp), median",
        [
            "worker",
            "imports s",
            "model load s",
            "first call ms",
            "second call ms",
            "start → first prediction s",
            "resident MiB after",
            "peak resident MiB",
        ],
    )
    for label, runs in worker_runs.items():
        worker_table.rows.append(
            {
                "worker": label,
                "imports s": _median(runs, "import_s"),
                "model load s": _median(runs, "load_s"),
                "first call ms": _median(runs, "first_call_s") * 1e3,
                "second call ms": _median(runs, "second_call_s") * 1e3,
                "start → first prediction s": _median(runs, "to_first_prediction_s"),
                "resident MiB after": _median(runs, "rss_end_mib"),
                "peak resident MiB": _median(runs, "rss_peak_mib"),
            }
        )
    local, far = worker_runs["in-process TensorFlow"], worker_runs["remote (udfserve client)"]
    startup_ratio = _median(local, "to_first_prediction_s") / _median(far, "to_first_prediction_s")
    memory_ratio = _median(local, "rss_peak_mib") / _median(far, "rss_peak_mib")
    notes = [
        f"A worker on the remote path reaches its first prediction {startup_ratio:.1f}x sooner than one "
        f"that imports TensorFlow and loads the model, and peaks at 1/{memory_ratio:.1f} of its resident "
        "memory; the model server pays the TensorFlow start once per device instead of once per worker.",
        "The server's first request pays the new channel's connection; the model was warmed up at load "
        "(one call at 1 row and one at max_batch_size), so no tracing happens on a request.",
    ]
    plot_file = f"{NAME}.png"
    plots.bar_panels(
        results_dir(settings.quick) / plot_file,
        "Cold start",
        [
            (
                "seconds to ready / to first prediction (median)",
                "s",
                {
                    "server, 1 model": _median(server_runs["tabular_mlp only"], "serving_s"),
                    "server, 3 models": _median(server_runs["all three example models"], "serving_s"),
                    "worker, in-process TF": _median(local, "to_first_prediction_s"),
                    "worker, remote": _median(far, "to_first_prediction_s"),
                },
            ),
            (
                "peak resident memory of a fresh worker",
                "MiB",
                {
                    "in-process TF": _median(local, "rss_peak_mib"),
                    "remote": _median(far, "rss_peak_mib"),
                },
            ),
        ],
    )
    method = (
        "Each start is a new `udfserve serve` process on a unix socket and TCP port 0 with a fresh copy of "
        "the example models; the clock starts just before the process is spawned. `listening` is when its "
        "ready file appears, `serving` when the gRPC health service reports SERVING (every model loaded and "
        "warmed up). The first request is the first on a new channel from this process. The worker rows are "
        "fresh interpreters measured from their first line: importing TensorFlow, loading the Keras model "
        "and calling it through a `tf.function` (the first call traces), or importing grpc, pyarrow and the "
        "wire contract and calling the running server."
    )
    return ComparisonResult(
        name=NAME,
        title="Cold start: server start to ready, first request",
        method=method,
        tables=[server_table, worker_table],
        notes=notes,
        plot_file=plot_file,
        raw={"server": server_runs, "workers": worker_runs},
        duration_s=duration_s,
    )


def main() -> int:
    return main_for(run, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
