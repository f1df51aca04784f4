"""Processes the benchmarks start and watch: model servers, their repositories, CPU and memory.

A ``Workspace`` is one benchmark run's scratch space: a short temporary folder (unix socket
paths are limited to about 100 bytes), the model repositories written for the run, and every
server started in it, all stopped and removed on exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import yaml

from udfserve.services.model_server.launcher import ServerProcess, launch_server

logger = logging.getLogger(__name__)

LOGS_DIR = Path(__file__).resolve().parent / "results" / "tmp" / "logs"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: this one, TensorFlow's C++ logging quietened, no CUDA."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **(extra or {})}


def run_json_child(
    module: str,
    payload: Mapping[str, Any],
    log_file: str,
    what: str,
    env: Mapping[str, str],
    timeout_s: float,
) -> dict[str, Any]:
    """Run ``python -m <module> '<payload as JSON>'`` in a fresh process and return the JSON object
    on the last line of its output; its standard error goes to ``log_file`` (nothing when empty).
    ``what`` names the job in the error raised when the child fails."""
    log = open(log_file or os.devnull, "ab")  # noqa: SIM115 (closed below)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", module, json.dumps(payload)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=child_env(env),
            timeout=timeout_s,
            check=False,
        )
    finally:
        log.close()
    if completed.returncode != 0:
        tail = Path(log_file).read_text(errors="replace")[-3000:] if log_file else ""
        raise RuntimeError(f"{what} failed with exit code {completed.returncode}; log tail:\n{tail}")
    lines = completed.stdout.decode().strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class Workspace:
    """Scratch space of one benchmark run; stops its servers and removes itself on exit."""

    def __init__(self, prefix: str = "udfsb-") -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self._servers: list[ServerProcess] = []
        self._examples: dict[tuple[str, ...], Path] = {}
        self._counter = 0

    def __enter__(self) -> Workspace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for server in self._servers:
            server.terminate(timeout_s=15)
        shutil.rmtree(self.root, ignore_errors=True)

    def path(self, name: str) -> Path:
        self._counter += 1
        return self.root / f"{self._counter}-{name}"

    # -- model repositories ---------------------------------------------------------------------
    def example_models(self, flags: Sequence[str] = ()) -> Path:
        """The project's example models, generated once per workspace (and per set of ``udfserve
        models generate`` flags, such as ``--onnx``) in a child process."""
        key = tuple(sorted(flags))
        if key not in self._examples:
            target = self.root / ("examples" + "".join(flag.replace("-", "_") for flag in key))
            command = [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(target), *key]
            completed = subprocess.run(command, capture_output=True, text=True, env=child_env(), check=False)
            if completed.returncode != 0:
                raise RuntimeError(
                    f"generating the example models failed with exit code {completed.returncode}: "
                    f"{completed.stderr[-2000:]}"
                )
            self._examples[key] = target
        return self._examples[key]

    def repository(
        self, name: str, models: Mapping[str, Mapping[str, Any]], flags: Sequence[str] = ()
    ) -> Path:
        """A repository of example models by name, each with config.yaml fields overridden;
        ``flags`` are those of ``udfserve models generate`` that write the models named."""
        root = self.path(name)
        for model, overrides in models.items():
            source = self.example_models(flags) / model
            shutil.copytree(source, root / model)
            config_path = root / model / "config.yaml"
            config = yaml.safe_load(config_path.read_text()) or {}
            config_path.write_text(yaml.safe_dump(_merge(config, overrides), sort_keys=False))
        return root

    # -- servers --------------------------------------------------------------------------------
    def start_server(
        self,
        repository: Path,
        label: str,
        extra_args: Sequence[str] = (),
        wait: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> ServerProcess:
        LOGS_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOGS_DIR / f"{label}.log"
        log_path.unlink(missing_ok=True)
        server = launch_server(
            repository,
            socket=self.path(label).with_suffix(".sock"),
            port=0,
            http_port=0,
            extra_args=["--log-level", "WARNING", *extra_args],
            env=child_env(env),
            log_path=log_path,
            wait=wait,
        )
        self._servers.append(server)
        return server

    def start_echo_server(
        self, max_message_bytes: int, env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        """The bare gRPC echo server of ``benchmarks.echo_server``, once it listens."""
        socket_path = self.path("echo").with_suffix(".sock")
        ready_file = self.path("echo").with_suffix(".ready.json")
        command = [
            sys.executable,
            "-m",
            "benchmarks.echo_server",
            "--socket",
            str(socket_path),
            "--ready-file",
            str(ready_file),
            "--max-message-bytes",
            str(max_message_bytes),
        ]
        process = subprocess.Popen(command, env=child_env(env), stderr=subprocess.DEVNULL)
        server = ServerProcess(process=process, ready_file=ready_file, log_path=None)
        self._servers.append(server)
        deadline = time.monotonic() + 60
        while not ready_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the echo server did not start (exit code {process.poll()})")
            time.sleep(0.05)
        server.addresses = json.loads(ready_file.read_text())
        return server

    def stop_server(self, server: ServerProcess) -> None:
        server.terminate(timeout_s=15)
        if server in self._servers:
            self._servers.remove(server)


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# -- metrics of a server ---------------------------------------------------------------------------
def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10) as response:
        return response.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric == name and wanted <= set(label_text.rstrip("}").split(",")) - {""}:
            total += float(value)
    return total


# -- CPU and memory --------------------------------------------------------------------------------
MALLOC_KEEPS_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc malloc settings that keep freed memory in the process for reuse: buffers up to 32 MiB
come from the heap rather than from fresh mappings, and the heap is not handed back to the
system until 1 GiB is free at its top. Where a page fault is expensive (some virtual machines),
this removes a fault per 4 KiB page of every large message."""

GLIBC_MALLOC_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": "", "MALLOC_TRIM_THRESHOLD_": ""}
"""For a model server: empty values make udfserve's launcher leave glibc's own defaults in place."""


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[7])  # field 10 of stat(5), counted after the command name


_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_group(pid: int, tid: int, name: str) -> str:
    """Which part of a server a thread belongs to, from its kernel name (``comm``)."""
    if tid == pid:
        return "event loop (main thread)"
    if name.startswith("tf_"):
        return "TensorFlow compute threads"
    if name.startswith(("event_engine", "grpc")):
        return "gRPC core threads"
    if name.startswith("python"):
        return "other Python threads (inference calls)"
    return "other threads"


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of ``pid`` so far, with its group (Linux; empty elsewhere)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tid = int(task.name)
        ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
        threads[tid] = (thread_group(pid, tid, name), ticks / _CLOCK_TICKS_PER_S)
    return threads


@dataclass
class ProcessUsage:
    """CPU time and minor page faults a process used over ``wall_s``; CPU by thread group."""

    wall_s: float
    cpu_s: float
    minor_faults: int
    cpu_s_by_group: dict[str, float] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        """CPU seconds per wall second (1.0 = one core busy)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class ProcessMeter:
    """CPU time (all threads) and minor page faults of one process over a span of wall time."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._process = psutil.Process(pid)
        self._start = (0.0, 0.0, 0)
        self._threads: dict[int, tuple[str, float]] = {}

    def _now(self) -> tuple[float, float, int]:
        times = self._process.cpu_times()
        return time.perf_counter(), times.user + times.system, minor_faults(self._pid)

    def start(self) -> None:
        self._threads = thread_cpu_s(self._pid)
        self._start = self._now()

    def stop(self) -> ProcessUsage:
        wall, cpu, faults = self._now()
        by_group: dict[str, float] = {}
        for tid, (group, seconds) in thread_cpu_s(self._pid).items():
            used = seconds - self._threads.get(tid, (group, 0.0))[1]
            by_group[group] = by_group.get(group, 0.0) + used
        return ProcessUsage(wall - self._start[0], cpu - self._start[1], faults - self._start[2], by_group)


def resident_without_shared_memory(process: psutil.Process) -> int:
    """Resident bytes of ``process`` less its pages of shared memory (files in ``/dev/shm``, SysV
    segments): where several processes map one shared-memory object, as Ray's workers and raylet
    map its object store, the object is counted once, apart, instead of once per process
    (Linux: ``RssAnon + RssFile`` of ``/proc/<pid>/status``; the whole resident size elsewhere)."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
        )
        return sum(int(fields[name].split()[0]) * 1024 for name in ("RssAnon", "RssFile"))
    except (OSError, KeyError, ValueError):
        return int(process.memory_info().rss)


class PeakRssSampler:
    """Samples, in a thread, the resident memory of the processes ``select`` returns.

    Records the peak of the sum over the selected processes and the peak of any single one;
    a process that appears and exits between two samples (every ``interval_s``) is missed.
    """

    def __init__(
        self,
        select: Callable[[], Iterable[psutil.Process]],
        interval_s: float = 0.05,
        pss_every: int = 0,
        resident: Callable[[psutil.Process], int] | None = None,
    ) -> None:
        """``resident``: how a process's resident bytes are read (its RSS unless given).
        ``pss_every``: also sum the proportional set size every that many samples (0: never).
        Summing resident sizes counts a page shared by several processes (a forking daemon's
        imports in each child it forked) once per process; the proportional size divides it
        among them, so its sum is the memory the processes take together. Reading it walks the
        page tables (``/proc/<pid>/smaps_rollup``), hence less often than the resident size."""
        self._select = select
        self._interval_s = interval_s
        self._pss_every = pss_every
        self._resident = resident or (lambda process: int(process.memory_info().rss))
        self._samples = 0
        self.peak_pss_total_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_total_bytes = 0
        self.peak_single_bytes = 0
        self.max_processes = 0
        self.pids_seen: set[int] = set()
        self.cpu_s: dict[int, float] = {}
        """Last CPU time seen of each process (user + system), for ``cpu_since``."""
        self._lock = threading.Lock()
        self._peaks_paused = False

    @contextlib.contextmanager
    def peaks_paused(self) -> Iterator[None]:
        """Leave the block's samples out of the peaks (CPU times are still followed): for work
        that other contenders do not do, such as the long jobs only some applications run."""
        self._peaks_paused = True
        try:
            yield
        finally:
            self._peaks_paused = False

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval_s)

    def sample(self) -> int:
        """One sample of the processes; their resident bytes summed at this instant."""
        total, count, pss_total = 0, 0, 0
        with_pss = self._pss_every > 0 and self._samples % self._pss_every == 0
        self._samples += 1
        for process in self._select():
            try:
                rss = self._resident(process)
                times = process.cpu_times()
                if with_pss:
                    pss_total += process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += rss
            count += 1
            with self._lock:
                self.pids_seen.add(process.pid)
                self.cpu_s[process.pid] = times.user + times.system
            if not self._peaks_paused:
                self.peak_single_bytes = max(self.peak_single_bytes, rss)
        if not self._peaks_paused:
            self.peak_total_bytes = max(self.peak_total_bytes, total)
            self.peak_pss_total_bytes = max(self.peak_pss_total_bytes, pss_total)
            self.max_processes = max(self.max_processes, count)
        return total

    def cpu_snapshot(self) -> dict[int, float]:
        """Sample now and return the CPU time of every process seen so far."""
        self.sample()
        with self._lock:
            return dict(self.cpu_s)

    def cpu_since(self, snapshot: dict[int, float]) -> float:
        """CPU seconds the sampled processes used since ``snapshot`` (a process that started and
        ended between two samples is missed)."""
        now = self.cpu_snapshot()
        return sum(seconds - snapshot.get(pid, 0.0) for pid, seconds in now.items())

    def __enter__(self) -> PeakRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
