"""perf_analyzer against udfserve's KServe endpoint and against a real Triton serving the same model.

    bash benchmarks/kserve/setup.sh          # once: Triton's own environment, perf_analyzer
    python -m benchmarks.kserve.run          # about 11 minutes on 2 cores

udfserve runs twice, with its native KServe front end (``udfserve-native``: the target is judged
on it; ``bash scripts/native.sh`` builds it) and with its python one (``udfserve``). The servers
serve ``tabular_mlp`` (64 -> 256 -> 256 -> 8, the example model) from the same
``model.keras``, with ``max_batch_size`` 1024 and a 2 ms dynamic-batching delay; Triton runs it
in its python backend through one ``tf.function``, as udfserve's backend does. First the same
rows go through both, over KServe gRPC with ``udfserve.spark_client.kserve_messages``, and their
predictions are compared; then perf_analyzer (synchronous requests, random FP32 data) measures
each point of the grid batch x concurrency, once per protocol (``--protocols``, see
``protocols.py``): gRPC, HTTP/REST (udfserve's ``--kserve-http-port`` against Triton's HTTP port)
and gRPC with system shared memory. All servers stay up, those not measured idle, and each
point is measured A B C C B A with the best run of each kept: on a shared machine, load from outside then
falls on all alike. ``Inferences/Second`` of perf_analyzer counts rows (requests x batch).

Writes ``benchmarks/kserve/results/perf_analyzer.{json,md}`` (gRPC), ``perf_analyzer-http.*`` and
``perf_analyzer-shm.*``, each as soon as its grid is measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import psutil
import pyarrow as pa
import tritonclient.grpc as triton
import yaml
from tritonclient.grpc import service_pb2_grpc

from benchmarks.kserve.protocols import PROTOCOLS, Protocol, parse_protocols
from benchmarks.kserve.triton_model import write_triton_repository
from udfserve.services.model_server.launcher import launch_server
from udfserve.spark_client.kserve_messages import (
    arrow_batch_to_infer_request,
    infer_response_to_arrow,
    specs_from_config,
)

logger = logging.getLogger("benchmarks.kserve")

HERE = Path(__file__).resolve().parent
DEFAULT_ENV_FILE = (
    Path(
        os.environ.get("UDFSERVE_KSERVE_BENCH_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "udfserve" / "kserve-bench"
    )
    / "env.sh"
)
MODEL = "tabular_mlp"
TARGET_RATIO = 1.0
UDFSERVE_SERVERS = ("udfserve-native", "udfserve")
"""udfserve with its native KServe front end (judged against the target), and with its python one."""
FRONTEND_OF = {"udfserve-native": "native", "udfserve": "python"}
LABEL = {"udfserve-native": "udfserve native", "udfserve": "udfserve python", "triton": "Triton"}
READY_TIMEOUT_S = 300.0


@dataclass
class Point:
    server: str
    batch: int
    concurrency: int
    rows_per_s: float | None
    p50_ms: float | None
    p99_ms: float | None
    stable: bool
    note: str = ""
    server_cpu_us_per_row: float | None = None
    """CPU time of the server's processes (Triton's backend stub included) over the whole
    perf_analyzer run, per row answered at the measured rate: what a row costs the server."""
    latency: Latency | None = None
    protocol: str = "grpc"


@dataclass(frozen=True)
class Latency:
    """perf_analyzer's breakdown of a request's mean latency, µs. The server's parts come from
    its statistics extension (``ModelStatistics``), which both servers answer."""

    total_us: float
    """The parts' sum, which is perf_analyzer's mean latency."""
    queue_us: float
    compute_us: float
    """Compute input + infer + output."""
    network_and_server_us: float
    """Client to server and back, and the server's request path outside its queue and the model."""

    @classmethod
    def from_csv_row(cls, row: Mapping[str, str]) -> Latency | None:
        try:
            queue_us = float(row["Server Queue"])
            compute_us = sum(float(row[f"Server Compute {part}"]) for part in ("Input", "Infer", "Output"))
            network_and_server_us = float(row["Network+Server Send/Recv"])
            client_us = float(row["Client Send"]) + float(row["Client Recv"])
        except (KeyError, ValueError):
            return None
        return cls(
            total_us=client_us + network_and_server_us + queue_us + compute_us,
            queue_us=queue_us,
            compute_us=compute_us,
            network_and_server_us=network_and_server_us,
        )


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY="value"`` lines written by setup.sh."""
    if not path.exists():
        raise SystemExit(f"{path} not found: run 'bash benchmarks/kserve/setup.sh' first")
    values = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return values


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def quiet_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **(extra or {})}


# -- servers -----------------------------------------------------------------------------------
@contextmanager
def udfserve_server(repository: Path, logs: Path, frontend: str) -> Iterator[tuple[dict[str, str], int]]:
    """udfserve with its python KServe front end (on the main port) or its native one, and its
    KServe HTTP port; yields its addresses by listener (``grpc``, ``http``) and its pid."""
    native = (
        ["--kserve-frontend", "native", "--kserve-port", "0"]
        if frontend == "native"
        else ["--kserve-frontend", "python"]
    )
    process = launch_server(
        repository,
        port=0,
        http_port=None,
        extra_args=["--models", MODEL, *native, "--kserve-http-port", "0"],
        env=quiet_env(),
        log_path=logs / f"udfserve-{frontend}.log",
    )
    try:
        yield {"grpc": process.kserve_target(), "http": process.kserve_http_address or ""}, process.pid
    finally:
        process.terminate()


@contextmanager
def triton_server(
    repository: Path, env_file: Mapping[str, str], logs: Path
) -> Iterator[tuple[dict[str, str], int]]:
    port, http_port = free_port(), free_port()
    command = [
        env_file["TRITONSERVER"],
        f"--model-repository={repository}",
        f"--backend-directory={env_file['TRITON_BACKEND_DIR']}",
        f"--grpc-port={port}",
        f"--http-port={http_port}",
        "--allow-metrics=false",
        "--log-verbose=0",
    ]
    env = quiet_env({"LD_LIBRARY_PATH": env_file["TRITON_LD_LIBRARY_PATH"]})
    with open(logs / "tritonserver.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    address = f"127.0.0.1:{port}"
    try:
        wait_for_model(address, process, logs / "tritonserver.log")
        yield {"grpc": address, "http": f"127.0.0.1:{http_port}"}, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_model(address: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ModelReady until the deadline; fail at once if the server exits."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with triton.InferenceServerClient(address) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {process.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                if client.is_model_ready(MODEL):
                    return
            except triton.InferenceServerException:
                pass
            time.sleep(0.5)
    raise RuntimeError(
        f"tritonserver did not serve {MODEL} within {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
    )


# -- predictions through both ------------------------------------------------------------------
def predict(address: str, batch: pa.RecordBatch) -> np.ndarray:
    with triton.InferenceServerClient(address) as client:
        input_specs, output_specs = specs_from_config(client.get_model_config(MODEL).config)
    request = arrow_batch_to_infer_request(batch, MODEL, request_id="check", input_specs=input_specs)
    with grpc.insecure_channel(address) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    answer = infer_response_to_arrow(response, output_specs)
    column = answer.column(0)
    return column.flatten().to_numpy().reshape(len(column), -1)


def check_batch() -> pa.RecordBatch:
    x = np.random.default_rng(7).normal(size=(256, 64))  # float64, as a Spark double column
    return pa.record_batch({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64)})


# -- perf_analyzer -----------------------------------------------------------------------------
GRID_MAX_BATCH_SIZE = 1024
"""``max_batch_size`` of ``tabular_mlp`` on both servers in these runs: the largest request of the
grid, as the grid was specified and first measured (the example config says 4,096, one call per
request of the Spark client)."""


def generate_examples(repository: Path) -> Path:
    """The example repository, written by the project's own command in a child process, with
    ``tabular_mlp`` limited to ``GRID_MAX_BATCH_SIZE`` rows per call (Triton's config is made from
    the same ``config.yaml``)."""
    subprocess.run(
        [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(repository)],
        check=True,
        capture_output=True,
        env=quiet_env(),
    )
    config_path = repository / MODEL / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["max_batch_size"] = GRID_MAX_BATCH_SIZE
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return repository


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every process under it, now."""
    root = psutil.Process(pid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def perf_analyzer(
    env_file: Mapping[str, str],
    address: str,
    pid: int,
    server: str,
    batch: int,
    concurrency: int,
    args: argparse.Namespace,
    work: Path,
    protocol: Protocol = PROTOCOLS["grpc"],
) -> Point:
    csv_path = work / f"{server}-{protocol.name}-b{batch}-c{concurrency}.csv"
    stabilities = [args.stability_percent, 2 * args.stability_percent]
    output = ""
    for stability in stabilities:
        command = [
            env_file["PERF_ANALYZER"],
            *("-m", MODEL, "-u", address, "-b", str(batch)),
            *protocol.perf_analyzer_args(batch),
            f"--concurrency-range={concurrency}",
            f"--measurement-interval={args.measurement_interval_ms}",
            f"--stability-percentage={stability}",
            f"--max-trials={args.max_trials}",
            *("-f", str(csv_path)),
        ]
        csv_path.unlink(missing_ok=True)
        cpu_before_s, wall_before_s = tree_cpu_s(pid), time.perf_counter()
        result = subprocess.run(
            command,
            env={**os.environ, "LD_LIBRARY_PATH": env_file["PERF_ANALYZER_LD_LIBRARY_PATH"]},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        server_cores = (tree_cpu_s(pid) - cpu_before_s) / (time.perf_counter() - wall_before_s)
        output = result.stdout + result.stderr
        if result.returncode == 0 and csv_path.exists():
            with open(csv_path, newline="") as handle:
                row = next(csv.DictReader(handle))
            note = "" if stability == args.stability_percent else f"stable within {stability}% only"
            rows_per_s = float(row["Inferences/Second"])
            return Point(
                server,
                batch,
                concurrency,
                rows_per_s,
                float(row["p50 latency"]) / 1000,
                float(row["p99 latency"]) / 1000,
                True,
                note,
                server_cores / rows_per_s * 1e6 if rows_per_s > 0 else None,
                Latency.from_csv_row(row),
                protocol.name,
            )
        logger.warning("%s b%d c%d: %s", server, batch, concurrency, output.strip().splitlines()[-1:])
    last_line = (output.strip().splitlines() or ["no output"])[-1][:200]
    return Point(server, batch, concurrency, None, None, None, False, last_line, protocol=protocol.name)


def interleaved(servers: Sequence[str], repeats: int) -> list[str]:
    """A B C C B A ...: each server measured as often, as early and as late as the others, so that
    load from outside the benchmark falls on all alike."""
    order: list[str] = []
    for repeat in range(repeats):
        order.extend(servers if repeat % 2 == 0 else list(reversed(servers)))
    return order


def best_of(runs: Sequence[Point]) -> Point:
    """The run least disturbed from outside: the highest rows/s of the stable runs."""
    measured = [p for p in runs if p.rows_per_s is not None]
    if not measured:
        return runs[-1]
    best = max(measured, key=lambda p: p.rows_per_s or 0.0)
    others = ", ".join(fmt(p.rows_per_s) for p in runs if p is not best)
    note = "; ".join(n for n in (best.note, f"other runs: {others} rows/s" if others else "") if n)
    return replace(best, note=note)


# -- report ------------------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _of(point: Point | None, name: str) -> float | None:
    """A measured figure of ``point``; None when the point was not measured."""
    return None if point is None else getattr(point, name)


def write_report(
    points: Sequence[Point],
    check: dict[str, object],
    meta: dict[str, object],
    output: Path,
    protocol: Protocol = PROTOCOLS["grpc"],
) -> None:
    """``<stem>.json`` and ``<stem>.md`` of one protocol's grid (``perf_analyzer`` for gRPC)."""
    output.mkdir(parents=True, exist_ok=True)
    points = [p for p in points if p.protocol == protocol.name]
    (output / f"{protocol.file_stem}.json").write_text(
        json.dumps(
            {"meta": meta, "protocol": protocol.name, "check": check, "points": [asdict(p) for p in points]},
            indent=2,
        )
    )
    by_key = {(p.server, p.batch, p.concurrency): p for p in points}
    grid = sorted({(p.batch, p.concurrency) for p in points})
    lines = [
        f"# KServe v2 over {protocol.title}: udfserve against a real Triton, measured with perf_analyzer",
        "",
        f"`{MODEL}` (64→256→256→8) from the same `model.keras`, max_batch_size 1024, dynamic batching "
        "with a 2 ms delay, on every server; Triton "
        f"{meta.get('triton_version', '')} runs it in its python backend through one `tf.function`, "
        "as udfserve's TensorFlow backend does. All servers up on one machine "
        f"({meta['cpus']} CPUs), those not measured idle; each point measured "
        f"{meta['repeats']} times per server, interleaved (A B C C B A), the best run kept; "
        f"perf_analyzer {meta['perf_analyzer_version']} over {protocol.title} "
        f"(`{' '.join(protocol.perf_analyzer_args(1)).replace('=1', '=<batch x 32>')}`), synchronous "
        "requests, "
        f"random FP32 data, {meta['measurement_interval_ms']} ms windows, stable within "
        f"{meta['stability_percent']}% (else twice that, noted). rows/s = perf_analyzer's "
        "inferences/s (requests x batch). Command: "
        f"`python -m benchmarks.kserve.run {meta.get('arguments', '')}`.",
        "",
        f"Load average of the machine (1 min) before and after the run: {meta['load_average_1m_before']} and "
        f"{meta['load_average_1m_after']}, on {meta['cpus']} CPUs: other work shared the machine, which is "
        "why each point is measured interleaved and the spread of the runs is listed below.",
        "",
        (
            "Same predictions: 256 float64 rows through `udfserve.spark_client.kserve_messages` to each "
            "udfserve front end "
            f"({', '.join(LABEL[name] for name in cast(list[str], check['compared_servers']))}) and to "
            "Triton, largest "
            f"absolute difference {check['max_abs_diff']:.2e} "
            f"({'equal within 1e-5' if check['equal'] else 'NOT equal'})."
            if check["compared"]
            else "Same predictions: not compared (one server measured in this run)."
        ),
        "",
        f"Target: udfserve at least {TARGET_RATIO:.1f}x Triton's rows/s at every point, judged on "
        "udfserve's native KServe front end (`--kserve-frontend native`, what `auto`, the default, serves "
        "with on a `--kserve-port` wherever it is built); its python front end (`--kserve-frontend python`, "
        "KServe on the main port beside the Arrow service) is measured beside it.",
        "",
        "Server CPU per row: CPU time of the server's processes (Triton's python backend stub "
        "included) during the whole perf_analyzer run, divided by the rows it answered at the "
        "measured rate; perf_analyzer itself runs on the same 2 CPUs, so where the machine is "
        "saturated, the server that spends less CPU per row answers more rows.",
        "",
    ]
    measured = [name for name in (*UDFSERVE_SERVERS, "triton") if any(p.server == name for p in points)]
    ours = [name for name in measured if name != "triton"]
    header = ["batch", "concurrency", *(f"{LABEL[name]} rows/s" for name in measured)]
    if "triton" in measured:
        header += [f"{LABEL[name]} ÷ Triton" for name in ours]
    header += [
        f"p50 / p99 ms, {' / '.join(LABEL[name] for name in measured)}",
        f"server CPU µs per row, {' / '.join(LABEL[name] for name in measured)}",
        "verdict",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---:|" * (len(header) - 1) + "---|"]
    for batch, concurrency in grid:
        at = {name: by_key.get((name, batch, concurrency)) for name in measured}
        ratios = {name: _ratio(at[name], at.get("triton")) for name in ours}
        judged = ratios.get(UDFSERVE_SERVERS[0])
        verdict = "n/a" if judged is None else ("met" if judged >= TARGET_RATIO else "**missed**")
        cells = [str(batch), str(concurrency), *(fmt(_of(at[name], "rows_per_s")) for name in measured)]
        if "triton" in measured:
            cells += [fmt(ratios[name], 2) for name in ours]
        cells += [
            " / ".join(f"{fmt(_of(at[n], 'p50_ms'), 2)}, {fmt(_of(at[n], 'p99_ms'), 2)}" for n in measured),
            " / ".join(fmt(_of(at[name], "server_cpu_us_per_row"), 1) for name in measured),
            verdict,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += latency_table(by_key, grid)
    notes = [f"- {p.server} b{p.batch} c{p.concurrency}: {p.note}" for p in points if p.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    (output / f"{protocol.file_stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _ratio(ours: Point | None, theirs: Point | None) -> float | None:
    if ours is None or theirs is None or not ours.rows_per_s or not theirs.rows_per_s:
        return None
    return ours.rows_per_s / theirs.rows_per_s


def latency_table(by_key: Mapping[tuple[str, int, int], Point], grid: Sequence[tuple[int, int]]) -> list[str]:
    """Where each server's mean request time went, as perf_analyzer splits it."""
    lines = [
        "",
        "**Where a request's time goes: perf_analyzer's breakdown of the mean latency, µs per request "
        "(the queue and compute parts from each server's statistics extension)**",
        "",
        "*mean* is the sum of perf_analyzer's parts (the client's own send and receive, a few µs, "
        "included). *network + server* is its *Network+Server Send/Recv*: the way to the server and "
        "back, the protocol's handling of the call on both sides (gRPC or HTTP), and the server's "
        "request path outside its queue and the model (parsing, checks, answer). *compute* is "
        "compute input + infer + output "
        "(udfserve counts its conversions inside *infer*; Triton's python backend adds its own "
        "transfer to the stub process).",
        "",
    ]
    measured = [name for name in (*UDFSERVE_SERVERS, "triton") if any(key[0] == name for key in by_key)]
    header = ["batch", "concurrency"]
    for name in measured:
        header += [f"{LABEL[name]}: mean", "queue", "compute", "network + server"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for batch, concurrency in grid:
        cells = []
        for server in measured:
            point = by_key.get((server, batch, concurrency))
            latency = point.latency if point is not None else None
            if latency is None:
                cells += ["n/a"] * 4
            else:
                cells += [
                    fmt(latency.total_us),
                    fmt(latency.queue_us),
                    fmt(latency.compute_us),
                    fmt(latency.network_and_server_us),
                ]
        lines.append(f"| {batch} | {concurrency} | " + " | ".join(cells) + " |")
    return lines


# -- main --------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", type=Path, default=DEFAULT_ENV_FILE, help="written by setup.sh")
    parser.add_argument("--batch", default="1,64,1024", help="comma-separated batch sizes")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--measurement-interval-ms", type=int, default=3000)
    parser.add_argument("--stability-percent", type=int, default=20)
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument(
        "--servers",
        default=",".join([*UDFSERVE_SERVERS, "triton"]),
        help="which servers to measure: udfserve-native (--kserve-frontend native), udfserve (the python "
        "front end), triton",
    )
    parser.add_argument(
        "--protocols",
        default=",".join(PROTOCOLS),
        help="how perf_analyzer reaches the servers, one grid each: grpc (-i grpc), http (-i http, "
        "udfserve's --kserve-http-port against Triton's HTTP port), shm (gRPC with --shared-memory=system)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per server and point, interleaved")
    parser.add_argument("--output", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def compare_predictions(predictions: Mapping[str, np.ndarray], rows: int) -> dict[str, object]:
    """The largest difference between each udfserve front end's predictions and Triton's."""
    compared = [name for name in UDFSERVE_SERVERS if name in predictions] if "triton" in predictions else []
    diff = max(
        (float(np.max(np.abs(predictions[name] - predictions["triton"]))) for name in compared),
        default=float("nan"),
    )
    return {
        "rows": rows,
        "compared": bool(compared),
        "compared_servers": compared,
        "max_abs_diff": diff,
        "equal": bool(diff <= 1e-5),
    }


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    env_file = read_env_file(args.env_file)
    batches = [int(b) for b in args.batch.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    servers = args.servers.split(",")
    protocols = parse_protocols(args.protocols)
    work = Path(tempfile.mkdtemp(prefix="udfsk-"))
    try:
        repository = generate_examples(work / "udfserve-repo")
        triton_repo = write_triton_repository(
            work / "triton-repo", repository / MODEL / "1" / "model.keras", env_file["TRITON_SITE_PACKAGES"]
        )
        batch = check_batch()
        predictions: dict[str, np.ndarray] = {}
        points: list[Point] = []
        meta: dict[str, object] = {
            "cpus": os.cpu_count(),
            "measurement_interval_ms": args.measurement_interval_ms,
            "stability_percent": args.stability_percent,
            "perf_analyzer_version": "2.48.0",
            "repeats": args.repeats,
            "arguments": " ".join(argv if argv is not None else sys.argv[1:]),
        }
        with ExitStack() as stack:
            addresses: dict[str, dict[str, str]] = {}
            pids: dict[str, int] = {}
            for server in servers:
                if server in UDFSERVE_SERVERS:
                    context = udfserve_server(repository, work, FRONTEND_OF[server])
                elif server == "triton":
                    context = triton_server(triton_repo, env_file, work)
                else:
                    raise SystemExit(
                        f"unknown server {server!r}; expected some of {[*UDFSERVE_SERVERS, 'triton']}"
                    )
                addresses[server], pids[server] = stack.enter_context(context)
                predictions[server] = predict(addresses[server]["grpc"], batch)
            if "triton" in addresses:
                with triton.InferenceServerClient(addresses["triton"]["grpc"]) as client:
                    meta["triton_version"] = client.get_server_metadata().version
            check = compare_predictions(predictions, batch.num_rows)
            for protocol in protocols:
                meta["load_average_1m_before"] = round(os.getloadavg()[0], 2)
                for rows in batches:
                    for concurrency in concurrencies:
                        runs: dict[str, list[Point]] = {server: [] for server in servers}
                        for server in interleaved(servers, args.repeats):
                            address = addresses[server][protocol.listener]
                            point = perf_analyzer(
                                env_file,
                                address,
                                pids[server],
                                server,
                                rows,
                                concurrency,
                                args,
                                work,
                                protocol,
                            )
                            logger.info(
                                "%s %s batch %d concurrency %d: %s rows/s",
                                protocol.name,
                                server,
                                rows,
                                concurrency,
                                fmt(point.rows_per_s),
                            )
                            runs[server].append(point)
                        points.extend(best_of(server_runs) for server_runs in runs.values())
                meta["load_average_1m_after"] = round(os.getloadavg()[0], 2)
                write_report(points, check, meta, args.output, protocol)
                logger.info("wrote %s", args.output / f"{protocol.file_stem}.md")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
