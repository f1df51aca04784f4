"""The model server's CPU per row on the Arrow path through shared memory, without Spark: this
tree's server beside a baseline commit's, in alternating rounds.

    python -m benchmarks.server_cpu [--baseline COMMIT] [--rounds N] [--seconds S] [--quick]

The null-model benchmark (``benchmarks.null_model``) measures the server's CPU per row against
the Spark Python workers'; this isolates the server's share. One client process
(``benchmarks.load_client``, kind ``client_shared_memory``: the Spark client's own stream, its
payloads in the node's shared memory) sends 16,384-row ``null_slice`` requests (64 float32
columns in, the first 8 out: ``benchmarks.null_models``) to a real ``udfserve serve`` process,
and the server's CPU-seconds (``psutil`` ``cpu_times``, all its threads, and its event loop's
thread apart) are read before and after each cell. ``--baseline`` starts a second server of that
commit's code (extracted with ``git archive`` and run from a linked tree, as
``benchmarks.tracing_cost`` runs the code before tracing); each round measures both, in an
order that alternates, so what else the machine runs lands on both. Per tree: the median over
the rounds, and the ratio to the baseline of each round's pair (the figure to quote on a shared
machine).
"""

from __future__ import annotations

import argparse
import logging
import statistics
from dataclasses import dataclass

import psutil

from benchmarks.cli import configure_logging
from benchmarks.load_client import LoadSpec, run_in_child
from benchmarks.null_model import BATCH_ROWS
from benchmarks.null_models import write_repository
from benchmarks.processes import Workspace, thread_cpu_s
from benchmarks.tracing_cost import _tree_env
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)

MODEL = "null_slice"
IN_FLIGHT = 2
"""Requests a stream keeps outstanding: the Spark client's default overlap of encode and serve."""
THIS = "this tree"


@dataclass(frozen=True)
class Cell:
    tree: str
    round: int
    rows: int
    requests: int
    wall_s: float
    server_cpu_s: float
    loop_cpu_s: float
    """Of ``server_cpu_s``, the event loop's (the main thread: gRPC, decode, batching, answers)."""
    client_cpu_s: float
    switches: int
    """The server's voluntary context switches (a thread waiting for another): steady under load,
    where CPU time is not."""

    @property
    def server_per_million(self) -> float:
        """Server CPU-seconds per million rows."""
        return self.server_cpu_s / self.rows * 1e6

    @property
    def client_per_million(self) -> float:
        return self.client_cpu_s / self.rows * 1e6


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(server: ServerProcess, tree: str, round_index: int, seconds: float) -> Cell:
    spec = LoadSpec(
        target=server.grpc_target(prefer_unix=True),
        model=MODEL,
        kind="client_shared_memory",
        rows=BATCH_ROWS,
        streams=1,
        in_flight=IN_FLIGHT,
        duration_s=seconds,
    )
    process = psutil.Process(server.pid)
    before, loop_before = cpu_s(process), thread_cpu_s(server.pid)[server.pid][1]
    switches_before = process.num_ctx_switches().voluntary
    result = run_in_child(spec)
    used, loop_used = cpu_s(process) - before, thread_cpu_s(server.pid)[server.pid][1] - loop_before
    switches = process.num_ctx_switches().voluntary - switches_before
    # the client's warm-up requests fall inside the server's window: count their rows too
    rows = result.rows + spec.warmup_requests * spec.rows
    return Cell(
        tree, round_index, rows, result.requests, result.wall_s, used, loop_used, result.cpu_s, switches
    )


def run(baseline: str | None, rounds: int, seconds: float) -> list[Cell]:
    with Workspace(prefix="udfsc-") as workspace:
        repository = write_repository(workspace.path("null-models"), max_batch_size=BATCH_ROWS)
        servers = {THIS: workspace.start_server(repository, "server-cpu", ["--models", MODEL])}
        if baseline:
            env = _tree_env(workspace, baseline)
            servers[f"baseline {baseline[:9]}"] = workspace.start_server(
                repository, "server-cpu-baseline", ["--models", MODEL], env=env
            )
        trees = list(servers)
        cells: list[Cell] = []
        for round_index in range(rounds):
            order = trees if round_index % 2 == 0 else trees[::-1]
            for tree in order:
                cell = measure(servers[tree], tree, round_index, seconds)
                per_million = cell.server_per_million
                logger.info("round %d, %s: %.3f server CPU-s per M rows", round_index, tree, per_million)
                cells.append(cell)
        return cells


def table(cells: list[Cell]) -> str:
    trees = list(dict.fromkeys(cell.tree for cell in cells))
    baseline = trees[1] if len(trees) > 1 else None
    lines = [
        "| tree | rows/s | server CPU-s / M rows | server µs / request | of which event loop "
        "| server context switches / request | client CPU-s / M rows | server / client "
        "| x baseline (per-round pairs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tree in trees:
        mine = [cell for cell in cells if cell.tree == tree]
        server = statistics.median(cell.server_per_million for cell in mine)
        client = statistics.median(cell.client_per_million for cell in mine)
        rate = statistics.median(cell.rows / cell.wall_s for cell in mine)
        loop = statistics.median(cell.loop_cpu_s / cell.rows * 1e6 for cell in mine) * BATCH_ROWS
        switches = statistics.median(cell.switches / cell.rows for cell in mine) * BATCH_ROWS
        ratio = ""
        if baseline and tree != baseline:
            theirs = {cell.round: cell for cell in cells if cell.tree == baseline}
            pairs = [cell.server_per_million / theirs[cell.round].server_per_million for cell in mine]
            ratio = f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})"
        lines.append(
            f"| {tree} | {rate:,.0f} | {server:.3f} | {server * BATCH_ROWS:,.0f} | {loop:,.0f} "
            f"| {switches:.1f} | {client:.3f} | {server / client:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", help="a commit of this checkout to run beside this tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="the load of one cell")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s: checks that the script works")
    args = parser.parse_args()
    configure_logging()
    rounds, seconds = (2, 1.0) if args.quick else (args.rounds, args.seconds)
    print(table(run(args.baseline, rounds, seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
