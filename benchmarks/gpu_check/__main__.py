"""``python -m benchmarks.gpu_check``: run the GPU check's steps, print the table, write it out.

    python -m benchmarks.gpu_check --device gpu --output DIR
    python -m benchmarks.gpu_check --device cpu               # the dry run

``scripts/gpu_check.sh`` runs this with the wheelhouse and the source tree on the path. A step
that raises is reported as a FAILED row naming the error, and the steps after it still run. The
exit code is 1 when any row FAILED, 2 when ``--device gpu`` finds no GPU, else 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from types import FrameType

from benchmarks.gpu_check import nvml
from benchmarks.gpu_check.node_check import check_node, node_for
from benchmarks.gpu_check.oom_check import check_oom
from benchmarks.gpu_check.plan import Plan, plan_for
from benchmarks.gpu_check.results import FAILED, RECORDED, Report, machine_description
from benchmarks.gpu_check.scoring import check_scoring
from benchmarks.gpu_check.serve_check import check_serve

logger = logging.getLogger("benchmarks.gpu_check")

STEPS = ("serve", "oom", "node")
"""The steps ``--only`` may name; ``node`` includes the executors' checks, which need its node."""
PACKAGES = (
    "torch",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnx",
    "nvidia-ml-py",
    "grpcio",
    "protobuf",
    "pyarrow",
    "numpy",
)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--device", choices=("gpu", "cpu"), default="gpu", help="gpu: the real run; cpu: the dry run"
    )
    parser.add_argument("--rows", type=int, help="rows of the MLP and null model runs (default: the plan's)")
    parser.add_argument("--heavy-rows", type=int, help="rows of the heavy model's runs (default: the plan's)")
    parser.add_argument("--only", default=",".join(STEPS), help=f"steps to run, of {', '.join(STEPS)}")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("build/gpu-check"),
        help="where the table, its JSON and the logs go",
    )
    return parser.parse_args(argv)


def versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def write_models(plan: Plan, repository: Path, log: Path) -> float:
    """The check's models, written by a child that sees no GPU; the seconds it took."""
    started = time.perf_counter()
    with open(log, "w") as output:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.gpu_check.models",
                str(repository),
                json.dumps(plan.as_dict()),
            ],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
            stdout=output,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=300,
        )
    return time.perf_counter() - started


def run_step(report: Report, step: str, action: Callable[[], None]) -> None:
    """Run one step; an exception becomes its FAILED row and the run goes on."""
    logger.info("step %s", step)
    started = time.perf_counter()
    try:
        action()
    except Exception as exc:
        logger.exception("step %s failed", step)
        report.add(step, "the step ran to its end", f"{type(exc).__name__}: {str(exc)[:400]}", FAILED)
    logger.info("step %s took %.1f s", step, time.perf_counter() - started)


def node_steps(plan: Plan, repository: Path, work: Path, report: Report) -> None:
    idle_memory = nvml.memory_used_bytes()
    with node_for(repository) as (node, discovery):
        check_node(plan, discovery, report)
        if discovery.servers:
            run_step(
                report,
                "executor",
                lambda: check_scoring(
                    plan, repository, node.discovery_file, discovery, idle_memory, work, report
                ),
            )


class Stopped(BaseException):
    """SIGTERM (the time limit of ``scripts/gpu_check.sh``): every step stops, its servers and its
    node are stopped by their own clean-up, and the table so far is written."""


def stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(f"stopped by signal {signum} (the run's time limit) before its end")


def run_checks(plan: Plan, steps: set[str], work: Path, report: Report) -> None:
    repository = work / "models"
    try:
        seconds = write_models(plan, repository, work / "models.log")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        tail = (work / "models.log").read_text(errors="replace")[-600:]
        report.add("setup", "models exported (torch.export, ONNX)", str(exc), FAILED, tail)
        return
    report.add(
        "setup",
        "models exported (torch.export, ONNX)",
        f"{seconds:.1f} s",
        RECORDED,
        f"heavy conv net {plan.heavy_side}x{plan.heavy_side}, channels {plan.heavy_channels}; "
        "in a child that sees no GPU",
    )
    if "serve" in steps:
        run_step(report, "serve", lambda: check_serve(plan, repository, work, report))
    if "oom" in steps:
        run_step(report, "oom", lambda: check_oom(plan, repository, work, report))
    if "node" in steps:
        run_step(report, "node", lambda: node_steps(plan, repository, work, report))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    args = parse_arguments(argv)
    plan = plan_for(args.device, args.rows, args.heavy_rows)
    steps = {step.strip() for step in args.only.split(",") if step.strip()}
    if unknown := steps - set(STEPS):
        raise SystemExit(
            f"--only {args.only!r}: unknown step(s) {sorted(unknown)}; expected some of {', '.join(STEPS)}"
        )
    if plan.device == "gpu" and not nvml.detection().gpus:
        print(f"--device gpu, but {nvml.describe()}; the dry run is --device cpu", file=sys.stderr)
        return 2
    report = Report(plan.device, {**machine_description(nvml.describe()), "packages": versions()})
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="udfserve-gpu-check-"))  # short: unix socket paths
    signal.signal(signal.SIGTERM, stop)
    try:
        run_checks(plan, steps, work, report)
    except Stopped as exc:
        report.add("run", "every step ran", str(exc), FAILED, "the steps before it are in the table")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        report.seconds = time.perf_counter() - started
        logs = args.output / "logs"
        shutil.rmtree(logs, ignore_errors=True)
        shutil.copytree(work, logs, ignore=shutil.ignore_patterns("models", "*.sock"), dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    markdown, _ = report.write(args.output)
    print(report.table())
    print()
    print(report.summary())
    print(f"written to {markdown} (and its .json); logs in {args.output / 'logs'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
