"""The command line every comparison shares: ``--quick``, ``--no-profile``, where results go.

A full run writes into ``benchmarks/results/`` (committed, and what ``docs/benchmarks.md`` is
built from); a ``--quick`` run only checks that the scripts work, so its small, short numbers go
to ``benchmarks/results/tmp/quick/`` and never replace the full ones.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.processes import Workspace
from benchmarks.report import RESULTS_DIR, ComparisonResult

QUICK_RESULTS_DIR = RESULTS_DIR / "tmp" / "quick"

RunFunction = Callable[[Workspace, bool, bool], ComparisonResult]


def results_dir(quick: bool) -> Path:
    return QUICK_RESULTS_DIR if quick else RESULTS_DIR


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("matplotlib", "PIL", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small and short: checks that the script works")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")


def main_for(run: RunFunction, doc: str | None, argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.<comparison>``: run it, write its results, print its Markdown."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    with Workspace() as workspace:
        result = run(workspace, args.quick, not args.no_profile)
    return write_and_print(result, args.quick)


def write_and_print(result: ComparisonResult, quick: bool) -> int:
    """Write ``result`` where its kind of run goes, print its Markdown and where it went; 0."""
    folder = results_dir(quick)
    result.write(folder)
    print(result.to_markdown())
    print(f"\nwritten to {folder}")
    return 0
