"""Run every comparison and regenerate the benchmark document.

    python -m benchmarks.run_all [--quick] [--no-profile] [--only transport batching ...]

A full run writes ``benchmarks/results/`` and ``docs/benchmarks.md``; ``--quick`` checks that the
scripts work in a couple of minutes and writes only under ``benchmarks/results/tmp/quick/``. A
comparison that fails is reported and the others still run; the command then exits with 1.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

if __package__ in (None, ""):  # run as a file: python benchmarks/run_all.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (
    backends,
    batching,
    cold_start,
    docs,
    fairness,
    footprint,
    null_model,
    scaling,
    soak,
    spark_e2e,
    transport,
    xgboost_scoring,
)
from benchmarks.cli import RunFunction, add_common_arguments, configure_logging, results_dir
from benchmarks.processes import Workspace
from benchmarks.report import describe_machine

logger = logging.getLogger("benchmarks.run_all")

COMPARISONS: dict[str, RunFunction] = {
    "transport": transport.run,
    "batching": batching.run,
    "cold_start": cold_start.run,
    "spark_e2e": spark_e2e.run,
    "footprint": footprint.run,
    "backends": backends.run,
    "scaling": scaling.run,
    "soak": soak.run,
    "fairness": fairness.run,
    "xgboost_scoring": xgboost_scoring.run,
    "null_model": null_model.run,
}


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--only", nargs="+", choices=list(COMPARISONS), default=list(COMPARISONS), help="comparisons to run"
    )
    args = parser.parse_args(argv)
    configure_logging()
    # SIGTERM unwinds like Ctrl-C, so the servers and Spark applications started so far are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    folder = results_dir(args.quick)
    failed = []
    started = time.perf_counter()
    for name in args.only:
        logger.info("=== %s%s", name, " (quick)" if args.quick else "")
        machine = describe_machine()  # the load average as this comparison starts
        try:
            with Workspace() as workspace:
                result = COMPARISONS[name](workspace, args.quick, not args.no_profile)
        except Exception:
            logger.error("%s failed:\n%s", name, traceback.format_exc())
            failed.append(name)
            continue
        result.write(folder, machine)
        logger.info("=== %s done in %.0f s", name, result.duration_s)
    doc = docs.write_doc(args.quick)
    logger.info("all done in %.1f min; document: %s", (time.perf_counter() - started) / 60, doc)
    if failed:
        logger.error("failed: %s", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
