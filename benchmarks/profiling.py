"""Where the time goes: py-spy sampling of a running process, summarised by function.

``SampledProfile`` runs ``py-spy record`` against a process (a model server, or this very
process for the client side) while a load runs, and summarises the folded stacks: the share of
samples in which a function is on the stack (inclusive) and at the top of it (self).
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from benchmarks.report import Table

logger = logging.getLogger(__name__)

_PREFIX = re.compile(r"^.*?/(site-packages|lib/python3\.\d+)/")
_PROJECT_PREFIXES = ("services/", "udfserve/", "spark_client/", "benchmarks/")


def py_spy_path() -> str | None:
    """py-spy from PATH, else the one installed next to this interpreter (a venv not activated)."""
    found = shutil.which("py-spy")
    if found is None:
        candidate = Path(sys.executable).parent / "py-spy"
        found = str(candidate) if candidate.exists() else None
    return found


def py_spy_available() -> bool:
    return py_spy_path() is not None


@dataclass
class ProfileSummary:
    """Share of samples per function; ``samples`` counts every stack py-spy recorded."""

    label: str
    samples: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)
    self_time: Counter[str] = field(default_factory=Counter)
    threads: Counter[str] = field(default_factory=Counter)

    def share(self, counts: Counter[str], frame: str) -> float:
        return 100.0 * counts[frame] / self.samples if self.samples else 0.0

    def tables(self, top: int = 12) -> list[Table]:
        self_table = Table(
            f"{self.label}: functions at the top of the stack (self time), {self.samples:,} samples",
            ["function", "% of samples"],
            [
                {"function": f, "% of samples": self.share(self.self_time, f)}
                for f, _ in self.self_time.most_common(top)
            ],
        )
        project = Counter({f: n for f, n in self.inclusive.items() if _is_project(f)})
        inclusive_table = Table(
            f"{self.label}: udfserve functions on the stack (inclusive time)",
            ["function", "% of samples"],
            [{"function": f, "% of samples": self.share(project, f)} for f, _ in project.most_common(top)],
        )
        threads_table = Table(
            f"{self.label}: samples by thread (a thread is sampled while it runs, not while it waits)",
            ["thread", "% of samples"],
            [
                {"thread": t, "% of samples": self.share(self.threads, t)}
                for t, _ in self.threads.most_common(8)
            ],
        )
        return [threads_table, inclusive_table, self_table]

    def to_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "samples": self.samples,
            "inclusive_top": self.inclusive.most_common(40),
            "self_top": self.self_time.most_common(40),
            "threads": self.threads.most_common(),
        }


def _is_project(frame: str) -> bool:
    location = frame[frame.rfind("(") + 1 :]
    return location.startswith(_PROJECT_PREFIXES)


def _short(frame: str) -> str:
    """``name (/long/path/site-packages/pkg/mod.py:12)`` -> ``name (pkg/mod.py)``."""
    name, _, location = frame.partition(" (")
    location = location.rstrip(")")
    location = re.sub(r":\d+$", "", location)
    location = _PREFIX.sub("", location)
    for marker in _PROJECT_PREFIXES:
        index = location.find("/" + marker)
        if index >= 0:
            location = location[index + 1 :]
            break
    return f"{name} ({location})" if location else name


def summarise_folded(path: Path, label: str) -> ProfileSummary:
    summary = ProfileSummary(label)
    if not path.exists():
        return summary
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw_frames = [frame for frame in stack.split(";") if frame]
        thread = "?"
        if raw_frames and raw_frames[0].startswith("thread ("):
            # "thread (1234): infer-tabular_mlp_0": the name, without pool indices
            thread = re.sub(r"_\d+$", "", raw_frames.pop(0).partition("): ")[2] or "?")
        frames = [_short(frame) for frame in raw_frames if not frame.startswith("process ")]
        if not frames:
            continue
        summary.samples += count
        summary.threads[thread] += count
        summary.self_time[frames[-1]] += count
        for frame in set(frames):
            summary.inclusive[frame] += count
    return summary


class SampledProfile:
    """``py-spy record`` of ``pid`` for the duration of a ``with`` block."""

    def __init__(self, pid: int, output: Path, *, rate_hz: int = 200, native: bool = False) -> None:
        self.pid = pid
        self.output = output
        self._command = [
            py_spy_path() or "py-spy",
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate_hz),
            "--format",
            "raw",
            "--function",
            "--threads",
            "--output",
            str(output),
        ]
        # Without native frames py-spy need not pause the process to sample it; native
        # unwinding (C frames: copies, gRPC core) needs the pause.
        self._command.append("--native" if native else "--nonblocking")
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SampledProfile:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.output.unlink(missing_ok=True)
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
        try:
            _, stderr = self._process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, stderr = self._process.communicate()
        if not self.output.exists():
            logger.warning("py-spy wrote no profile for pid %d: %s", self.pid, stderr.decode()[-500:])

    def summary(self, label: str) -> ProfileSummary:
        return summarise_folded(self.output, label)
