"""The GPU check's findings: one row per figure, each with its verdict, printed as one table.

Verdicts: ``ok`` and ``FAILED`` for what must hold; ``met`` and ``missed`` for a figure measured
against a stated target; ``recorded`` for a figure with no target (what the machine does);
``skipped: <why>`` for what this machine cannot show (the dry run's NVIDIA parts). Only
``FAILED`` makes the run fail: a missed target is a finding, not a broken path.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, FAILED, MET, MISSED, RECORDED = "ok", "FAILED", "met", "missed", "recorded"


def skipped(why: str) -> str:
    return f"skipped: {why}"


def holds(condition: bool) -> str:
    return OK if condition else FAILED


def against(ratio: float, target: float) -> str:
    return MET if ratio >= target else MISSED


@dataclass(frozen=True)
class Finding:
    """One row of the table: which check, what was measured, the figure, the verdict, and how."""

    check: str
    what: str
    figure: str
    verdict: str
    detail: str = ""


@dataclass
class Report:
    """Every finding of a run, in the order the checks ran, and the machine they ran on."""

    device: str
    machine: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    seconds: float = 0.0

    def add(self, check: str, what: str, figure: str, verdict: str, detail: str = "") -> None:
        self.findings.append(Finding(check, what, figure, verdict, detail))

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == FAILED]

    def table(self) -> str:
        """The findings as a Markdown table, one row each."""
        lines = ["| check | what | figure | verdict | how |", "|---|---|---|---|---|"]
        for f in self.findings:
            cells = [
                f.check,
                f.what,
                f.figure,
                f"**{f.verdict}**" if f.verdict == FAILED else f.verdict,
                f.detail,
            ]
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
        return "\n".join(lines)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for f in self.findings:
            key = f.verdict.split(":", 1)[0]
            counts[key] = counts.get(key, 0) + 1
        parts = ", ".join(f"{count} {verdict}" for verdict, count in counts.items())
        return f"{len(self.findings)} findings on {self.device} in {self.seconds:.0f} s: {parts}"

    def write(self, folder: Path) -> tuple[Path, Path]:
        """``gpu_check.md`` and ``gpu_check.json`` in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        markdown = folder / "gpu_check.md"
        machine = ", ".join(f"{k}: {v}" for k, v in self.machine.items())
        markdown.write_text(f"{self.table()}\n\n{self.summary()}\n\nMachine: {machine}\n", encoding="utf-8")
        data = {**asdict(self), "findings": [asdict(f) for f in self.findings]}
        json_path = folder / "gpu_check.json"
        json_path.write_text(json.dumps(data, indent=2), encoding="utf-8")
        return markdown, json_path


def machine_description(gpu: str) -> dict[str, Any]:
    """The host as the table's reader needs it: CPU cores, Python, the GPU NVML names."""
    return {
        "host": platform.node(),
        "cpu cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "gpu": gpu,
    }


def rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f} rows/s" if seconds > 0 else "n/a"


def mib(value: float) -> str:
    return f"{value / (1 << 20):,.0f} MiB"
