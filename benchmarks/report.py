"""Results of one comparison: tables, targets, notes; written as Markdown, JSON and a plot.

Every comparison returns a ``ComparisonResult``; ``write`` puts ``<name>.md``, ``<name>.json``
(and the plot the comparison drew, ``<name>.png``) into the results folder, and
``benchmarks.docs`` assembles them into the repository's benchmark document.
"""

from __future__ import annotations

import datetime
import json
import mmap
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"

VERSIONED_PACKAGES = (
    "udfserve",
    "tensorflow",
    "keras",
    "onnxruntime",
    "torch",
    "pyarrow",
    "grpcio",
    "protobuf",
    "numpy",
    "pandas",
    "pyspark",
)


@dataclass
class Table:
    """One table: ``rows`` are dicts keyed by ``columns``; floats are formatted on output."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_markdown(self) -> str:
        header = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|"
        lines = [f"**{self.title}**", "", header, rule]
        for row in self.rows:
            lines.append("| " + " | ".join(format_cell(row.get(column)) for column in self.columns) + " |")
        return "\n".join(lines)


@dataclass
class TargetCheck:
    """A benchmark target, the measured value and whether it was met in this run."""

    target: str
    measured: str
    met: bool | None
    """``None`` when the comparison could not be run (the reason is in ``measured``)."""

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]


@dataclass
class ComparisonResult:
    name: str
    title: str
    method: str
    tables: list[Table] = field(default_factory=list)
    targets: list[TargetCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plot_file: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_markdown(self, plot_prefix: str = "") -> str:
        parts = [self.method.strip(), ""]
        if self.targets:
            parts += ["| target | measured | verdict |", "|---|---|---|"]
            parts += [f"| {t.target} | {t.measured} | {t.verdict} |" for t in self.targets]
            parts.append("")
        for table in self.tables:
            parts += [table.to_markdown(), ""]
        if self.plot_file:
            parts += [f"![{self.title}]({plot_prefix}{self.plot_file})", ""]
        parts += [f"- {note}" for note in self.notes]
        return "\n".join(parts).rstrip() + "\n"

    def write(self, results_dir: Path = RESULTS_DIR, machine: dict[str, Any] | None = None) -> None:
        results_dir.mkdir(parents=True, exist_ok=True)
        document = {"machine": machine or describe_machine(), **asdict(self)}
        (results_dir / f"{self.name}.json").write_text(
            json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8"
        )
        (results_dir / f"{self.name}.md").write_text(
            f"# {self.title}\n\n{self.to_markdown()}\n{machine_markdown(document['machine'])}",
            encoding="utf-8",
        )


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 0.1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _source_revision() -> str:
    """The commit the code was measured at, marked when the working tree differed from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "services",
                "udfserve",
                "spark_client",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} (with uncommitted changes to the product code)" if changed else commit


def fresh_memory_mb_s(size_bytes: int = 32 << 20) -> float:
    """How fast this machine hands out memory never touched before: one write per 4 KiB page of a
    new anonymous mapping, so each write is a page fault. On bare metal this runs at many GB/s; in
    some virtual machines a fault costs tens of microseconds, and every large fresh buffer (a
    message, a protobuf arena, an Arrow array) is then bounded by it rather than by copying."""
    region = mmap.mmap(-1, size_bytes)
    started = time.perf_counter()
    for offset in range(0, size_bytes, mmap.PAGESIZE):
        region[offset] = 1
    elapsed = time.perf_counter() - started
    region.close()
    return size_bytes / elapsed / 1e6


def describe_machine() -> dict[str, Any]:
    """What the numbers were measured on; the load average shows how busy the machine was."""
    memory = psutil.virtual_memory()
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_gib": round(memory.total / 2**30, 1),
        "memory_available_gib": round(memory.available / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "gpu": "none (CPU only)",
        "fresh_memory_mb_s": round(fresh_memory_mb_s()),
        "versions": _versions(),
        "source_revision": _source_revision(),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine_markdown(machine: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
    load = " / ".join(str(x) for x in machine["load_average_1_5_15"])
    return (
        f"Machine: {machine['cpu_model']}, {machine['logical_cores']} logical cores "
        f"({machine['usable_cores']} usable), {machine['memory_total_gib']} GiB memory "
        f"({machine['memory_available_gib']} GiB available), {machine['os']}, GPU: {machine['gpu']}; "
        f"first touch of fresh memory (page faults) {machine.get('fresh_memory_mb_s', 0):,} MB/s; "
        f"load average at start {load}; measured {machine['measured_at']} at commit "
        f"{machine.get('source_revision', 'unknown')}.\n\nVersions: {versions}.\n"
    )
