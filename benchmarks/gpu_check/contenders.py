"""Runs of several processes side by side, started together, and what the GPU did meanwhile.

Each process (``benchmarks.gpu_check.executor`` or ``.in_process``) prepares its rows and its
model, prints ``{"ready": true}``, and waits; once all are ready each gets its start line, and
the run's rate is every process's rows over the time from the first start to the last end.
A ``Sampler`` reads figures (the GPU's utilisation and memory) every quarter second while they
run, and once more as they end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


class ContenderFailed(RuntimeError):
    """A process of a run exited or wrote something other than its JSON lines."""


@dataclass
class Run:
    """The processes' own reports, and the rate they made together."""

    results: list[dict[str, Any]]
    samples: list[dict[str, float]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(int(r["rows_out"]) for r in self.results)

    @property
    def seconds(self) -> float:
        return max(r["ended_at"] for r in self.results) - min(r["started_at"] for r in self.results)

    @property
    def rows_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def every(self, key: str) -> list[Any]:
        return [r[key] for r in self.results]

    def sampled(self, key: str) -> list[float]:
        """The samples of ``key`` taken while the processes ran."""
        return [sample[key] for sample in self.samples if key in sample]


Reading = Callable[[], dict[str, float]]
"""Figures read at one moment, by name; an empty dict when there is nothing to read."""


class Sampler:
    """Calls ``read`` every ``every_s`` on a thread of its own while in use; keeps what it read."""

    def __init__(self, read: Reading, every_s: float = 0.25) -> None:
        self._read = read
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-check-sampler", daemon=True)
        self.samples: list[dict[str, float]] = []

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._keep()  # a run shorter than a period still has its reading

    def _keep(self) -> None:
        try:
            value = self._read()
        except OSError:  # a scrape refused or timed out: that moment goes unsampled
            return
        if value:
            self.samples.append(value)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self._keep()


def run_together(
    module: str,
    payloads: Sequence[Mapping[str, Any]],
    env: Mapping[str, str],
    log_dir: Path,
    timeout_s: float,
    sample: Reading | None = None,
) -> Run:
    """Start one ``python -m module`` per payload, wait until all are ready, start them together,
    and collect their reports; ``sample`` is read while they run."""
    log_dir.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[str]] = []
    logs: list[IO[str]] = []
    deadline = time.monotonic() + timeout_s
    try:
        for index, payload in enumerate(payloads):
            opened = open(log_dir / f"{module.rsplit('.', 1)[-1]}-{index}.log", "w")  # noqa: SIM115 (closed below)
            logs.append(opened)
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", module, json.dumps(dict(payload))],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=opened,
                    text=True,
                    env=dict(env),
                )
            )
        for process, log in zip(processes, logs, strict=True):
            _read_line(process, log, deadline)  # {"ready": true}
        with Sampler(sample or dict) as sampler:
            for process in processes:
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            results = [
                _read_line(process, log, deadline) for process, log in zip(processes, logs, strict=True)
            ]
        for process in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        return Run(results, sampler.samples)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def _read_line(process: subprocess.Popen[str], log: IO[str], deadline: float) -> dict[str, Any]:
    assert process.stdout is not None
    line = _line_before(process.stdout, deadline)
    if not line:
        process.kill()
        process.wait()
        log.flush()
        tail = Path(log.name).read_text(errors="replace")[-3000:]
        raise ContenderFailed(
            f"pid {process.pid} ended or timed out without its report (exit code {process.returncode}); "
            f"its log, {log.name}:\n{tail}"
        )
    try:
        loaded: dict[str, Any] = json.loads(line)
    except ValueError as exc:
        raise ContenderFailed(f"pid {process.pid} wrote {line[:300]!r}, expected one JSON object") from exc
    return loaded


def _line_before(stream: IO[str], deadline: float) -> str:
    """The next line of ``stream``, or "" at its end or once ``deadline`` passes."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    return result[0] if result else ""


def cores_each(processes: int) -> str:
    """The CPU threads each of ``processes`` in-process contenders may use (``OMP_NUM_THREADS``)."""
    return str(max(1, len(os.sched_getaffinity(0)) // processes))
