"""Comparison: the demo's text job under back-pressure, this tree against a baseline tree, in one run.

    python -m benchmarks.text_backpressure --model-repository R [--baseline TREE] [--quick]

``R`` holds the example ``text_classifier`` (``udfserve models generate --text-classifier``); ``TREE``
is another checkout of udfserve (a ``git worktree`` of an earlier commit), run from a tree of links
(``scripts/source_tree.py``) so that its own code serves and scores. Three measurements:

- **Where a call's time goes**: in this process, the example's tokenizer alone, its ONNX model alone
  on the same tokens, and both, on calls of the model's ``max_batch_size`` (256 rows).
- **The server alone**: each tree's server fed by one stream of 4,096-row text requests kept 3 in
  flight (12,288 rows, under the 16,384 of the model's queue, so nothing is refused): the rows/s the
  server computes for the model when nothing else runs, and the share of that time in model calls.
- **The demo**: ``udfserve demo --model text_classifier --rows N`` of each tree (the README's first
  command, local[2]), its report as printed, and the figures read from it; and the same Spark job
  with a UDF that answers zeros instead of calling a server (``benchmarks.text_runs``): the rows/s
  the demo's Spark side allows on this machine, whatever the server does.

Rounds alternate the trees' order; the table gives each contender's median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.cli import configure_logging, write_and_print
from benchmarks.report import ComparisonResult, Table, TargetCheck
from benchmarks.text_runs import (
    ALONE_IN_FLIGHT,
    MODEL,
    REPO_ROOT,
    REQUEST_ROWS,
    demo_texts,
    run_demo,
    server_alone,
    spark_floor,
)
from benchmarks.tokenization import FEEDS, rows_per_second
from udfserve.runtime.model_config import TextPreprocess
from udfserve.runtime.preprocessing import open_tokenizer

NAME = "text_backpressure"
CALL_ROWS = 256
"""The example's ``max_batch_size``: the rows of one model call."""
WAITING_AT_MOST = 0.10
"""Target: the client waits out back-pressure at most this share of its tasks' time."""


# -- where a call's time goes ------------------------------------------------------------------
def call_contenders(repository: Path) -> dict[str, Callable[[], float]]:
    """Tokenizer alone, model alone, both: each a callable that measures its rows/s once."""
    import onnxruntime

    version = repository / MODEL / "1"
    tokenize = open_tokenizer(version / "tokenizer.json", TextPreprocess(max_length=64), FEEDS, "benchmark")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, len(os.sched_getaffinity(0)) - 1)  # as the server's backend
    session = onnxruntime.InferenceSession(
        str(version / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    texts = np.array([text.encode() for text in demo_texts(CALL_ROWS)], dtype=object)
    model = partial(session.run, None)
    return {
        "tokenizer alone": rows_per_second(partial(tokenize, texts), CALL_ROWS),
        "model alone": rows_per_second(partial(model, tokenize(texts)), CALL_ROWS),
        "tokenizer + model": rows_per_second(lambda: model(tokenize(texts)), CALL_ROWS),
    }


# -- the comparison ----------------------------------------------------------------------------
def run(
    repository: Path, baseline: Path | None, rows: int, rounds: int, duration_s: float
) -> ComparisonResult:
    started = time.perf_counter()
    trees = {"this tree": REPO_ROOT}
    if baseline is not None:
        trees = {"baseline": baseline.resolve(), **trees}
    rates: dict[str, list[float]] = {}
    alone: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    demos: dict[str, list[tuple[str, dict[str, float]]]] = {name: [] for name in trees}
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="udfs-text-") as scratch:
        folder = Path(scratch)
        contenders = call_contenders(repository)
        rates = {name: [] for name in contenders}
        for round_index in range(rounds):
            for name, measure in contenders.items():
                rates[name].append(measure())
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for name in order:
                alone[name].append(server_alone(trees[name], repository, folder, duration_s))
            for name in order:
                demos[name].append(run_demo(trees[name], repository, rows, folder))
            floors.append(spark_floor(rows, folder))
    return result(trees, rates, alone, demos, floors, rows, rounds, time.perf_counter() - started)


def result(
    trees: dict[str, Path],
    rates: dict[str, list[float]],
    alone: dict[str, list[dict[str, float]]],
    demos: dict[str, list[tuple[str, dict[str, float]]]],
    floors: list[float],
    rows: int,
    rounds: int,
    duration_s: float,
) -> ComparisonResult:
    calls = Table(
        f"Where a call of {CALL_ROWS} texts goes, in one process (median of {rounds} rounds)",
        ["contender", "rows/s", "µs a row"],
    )
    for name, values in rates.items():
        rate = statistics.median(values)
        calls.rows.append({"contender": name, "rows/s": rate, "µs a row": 1e6 / rate})

    def median(samples: list[dict[str, float]], key: str) -> float:
        return statistics.median(sample[key] for sample in samples)

    servers = Table(
        f"The server alone: 1 stream, {ALONE_IN_FLIGHT} requests of {REQUEST_ROWS:,} texts in flight",
        ["tree", "rows/s", "time in model calls", "server CPU (cores)"],
    )
    for name, samples in alone.items():
        servers.rows.append(
            {
                "tree": name,
                "rows/s": median(samples, "rows_per_s"),
                "time in model calls": f"{median(samples, 'in_model_calls'):.0%}",
                "server CPU (cores)": median(samples, "server_cpu"),
            }
        )
    ceiling = median(alone["this tree"], "rows_per_s")
    jobs = Table(
        f"The demo: udfserve demo --model {MODEL} --rows {rows:,} (local[2])",
        [
            "tree",
            "rows/s",
            "÷ server alone",
            "batches",
            "resends",
            "sends a batch",
            "client waited s",
            "share of tasks' time",
            "server held s",
            "server in model calls",
        ],
    )
    for name, runs in demos.items():
        figures = [figures for _, figures in runs]
        batches = median(figures, "batches")
        jobs.rows.append(
            {
                "tree": name,
                "rows/s": median(figures, "rows_per_s"),
                "÷ server alone": f"{median(figures, 'rows_per_s') / ceiling:.2f}x",
                "batches": int(batches),
                "resends": int(median(figures, "resends")),
                "sends a batch": (batches + median(figures, "resends")) / batches,
                "client waited s": median(figures, "waited_s"),
                "share of tasks' time": f"{median(figures, 'waited_share'):.0%}",
                "server held s": median(figures, "room_wait_s"),
                "server in model calls": _share(median(figures, "model_call_s") / median(figures, "seconds")),
            }
        )
    floor = statistics.median(floors)
    jobs.rows.append(
        {
            "tree": "no model: the Spark side alone",
            "rows/s": floor,
            "÷ server alone": f"{floor / ceiling:.2f}x",
        }
    )
    mine = [figures for _, figures in demos["this tree"]]
    share = median(mine, "waited_share")
    rate_ratio = median(mine, "rows_per_s") / ceiling
    resends, batches = max(f["resends"] for f in mine), median(mine, "batches")
    targets = [
        TargetCheck(
            f"the demo's tasks wait out back-pressure at most {WAITING_AT_MOST:.0%} of their time",
            f"{share:.1%} ({median(mine, 'waited_s'):.2f} s waited in a job of "
            f"{median(mine, 'seconds'):.1f} s, 2 tasks at a time)",
            share <= WAITING_AT_MOST,
        ),
        TargetCheck(
            "no batch sent more than twice",
            f"{resends:.0f} resends for {batches:.0f} batches",
            # none: each sent once; more resends than batches: one was sent 3 times at least
            True if resends == 0 else (False if resends > batches else None),
        ),
        TargetCheck(
            "the demo's rows/s at least the server's alone",
            f"{rate_ratio:.2f}x ({median(mine, 'rows_per_s'):,.0f} vs {ceiling:,.0f} rows/s; the demo's "
            f"Spark side alone, no model: {floor:,.0f} rows/s)",
            rate_ratio >= 1.0,
        ),
    ]
    notes = [f"{name}: commit {_revision(tree)}" for name, tree in trees.items()]
    for name, runs in demos.items():
        notes.append(f"the report of the last demo of {name}:\n\n```\n{runs[-1][0]}\n```")
    return ComparisonResult(
        name=NAME,
        title="Back-pressure: the demo's text job",
        method=_method(),
        tables=[calls, servers, jobs],
        targets=targets,
        notes=notes,
        raw={
            "calls": rates,
            "alone": alone,
            "demos": {k: [f for _, f in v] for k, v in demos.items()},
            "spark_floor": floors,
        },
        duration_s=duration_s,
    )


def _method() -> str:
    """The module's description after its first line, its command as code."""
    _, command, description = (__doc__ or "\n\n\n\n").split("\n\n", 2)
    return f"`{command.strip()}`\n\n{description.strip()}"


def _revision(tree: Path) -> str:
    """The tree's commit (with ``+changes`` when its files differ from it), not its path."""
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (head or "unknown") + (" +changes" if dirty else "")


def _share(value: float) -> str:
    return "-" if value != value else f"{value:.0%}"  # NaN: the tree's report does not say


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-repository", type=Path, required=True, help=f"holding {MODEL}")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to compare with")
    parser.add_argument("--rows", type=int, default=100_000, help="rows of each demo (default 100,000)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--duration-s", type=float, default=8.0, help="the server-alone load (default 8)")
    parser.add_argument("--quick", action="store_true", help="small and short: checks that the script works")
    args = parser.parse_args(argv)
    configure_logging()
    if args.quick:
        args.rows, args.rounds, args.duration_s = 8_192, 1, 1.0
    outcome = run(args.model_repository.resolve(), args.baseline, args.rows, args.rounds, args.duration_s)
    return write_and_print(outcome, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
