"""What the soak samples of a running node, and how it judges whether a measure stayed flat.

A ``NodeWatch`` reads, at each sample: the resident (and proportional) memory, open file
descriptors and threads of the supervisor and of its model servers (found through the node's
discovery file, so a restarted server is followed to its new pid), the payload files in the
node's shared-memory folder, the supervisor's restart counter (its ``/metrics``), and for
information the resident memory of the Spark application's Python workers and JVM.

A ``Trend`` is a least-squares line through the samples taken after the warm-up.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from benchmarks.processes import metric_value
from benchmarks.spark_job import _is_python_worker
from udfserve.discovery import DiscoveryError, read_discovery
from udfserve.shared_memory import FILE_PREFIX

MIB = 2**20
RESTARTS_METRIC = "udfserve_server_restarts_total"


@dataclass
class Sample:
    """One look at the node, ``t_s`` seconds after the soak's jobs began."""

    t_s: float
    server_rss_mib: float
    server_pss_mib: float
    server_fds: int
    server_threads: int
    servers: int
    """Model server processes found ready in the discovery file (their measures are summed)."""
    server_pids: list[int]
    supervisor_rss_mib: float
    supervisor_pss_mib: float
    supervisor_fds: int
    supervisor_threads: int
    shared_memory_files: int
    """Payload files of the node's folder, named or held open by the server or a Spark worker."""
    shared_memory_mib: float
    restarts: float
    spark_workers_rss_mib: float
    spark_jvm_rss_mib: float
    jobs_done: int


@dataclass
class _Usage:
    rss: int = 0
    pss: int = 0
    fds: int = 0
    threads: int = 0

    def add(self, process: psutil.Process) -> None:
        """Add one process's measures; one that exited meanwhile adds nothing."""
        try:
            with process.oneshot():
                full = process.memory_full_info()
                rss, pss, fds, threads = full.rss, full.pss, process.num_fds(), process.num_threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        self.rss, self.pss = self.rss + rss, self.pss + pss
        self.fds, self.threads = self.fds + fds, self.threads + threads


class NodeWatch:
    """Samples one ``udfserve node`` and the Spark application that calls it."""

    def __init__(
        self,
        supervisor_pid: int,
        runtime_dir: Path,
        shared_memory_dir: Path,
        spark_root: Callable[[], int | None],
        jobs_done: Callable[[], int],
    ) -> None:
        """``spark_root``: the pid of the Spark driver process running now (None between two)."""
        self._supervisor = psutil.Process(supervisor_pid)
        self._discovery = runtime_dir / "discovery.json"
        self._targets = runtime_dir / "prometheus-targets.json"
        self._shared_memory_dir = shared_memory_dir
        self._spark_root = spark_root
        self._jobs_done = jobs_done
        self.started_at = time.time()
        """The origin of the samples' ``t_s``, on the clock of the jobs' ``started_at``."""

    def server_pids(self) -> list[int]:
        try:
            discovery = read_discovery(self._discovery)
        except DiscoveryError:
            return []
        return [entry.pid for entry in discovery.ready_servers() if entry.pid is not None]

    def restarts(self) -> float:
        """The supervisor's restart counter, summed over its devices."""
        groups = json.loads(self._targets.read_text(encoding="utf-8"))
        [address] = [g["targets"][0] for g in groups if g["labels"].get("role") == "supervisor"]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            return metric_value(response.read().decode(), RESTARTS_METRIC)

    def shared_memory(self, holders: Iterable[int]) -> tuple[int, int]:
        """Count and bytes held of the payload files of the node's shared-memory folder: those in
        it, and those removed from it that a process of ``holders`` still holds open. A server
        removes a file's name once it opened it and keeps the descriptor until the stream ends,
        so most files in use have no name, and their memory shows in no process's resident size."""
        held: dict[tuple[int, int], int] = {}
        for path in self._shared_memory_dir.glob(f"{FILE_PREFIX}*"):
            _note(held, path)
        prefix = f"{self._shared_memory_dir}/{FILE_PREFIX}"
        for pid in holders:
            try:
                descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
            except OSError:  # exited, or not Linux
                continue
            for descriptor in descriptors:
                try:
                    if os.readlink(descriptor).startswith(prefix):
                        _note(held, descriptor)
                except OSError:  # closed between the listing and the look
                    continue
        return len(held), sum(held.values())

    def _spark(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """The Spark application's Python workers and JVM."""
        root = self._spark_root()
        if root is None:
            return [], []
        try:
            children = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            return [], []
        return [c for c in children if _is_python_worker(c)], [c for c in children if _named(c, "java")]

    def sample(self) -> Sample:
        pids = self.server_pids()
        servers, supervisor = _Usage(), _Usage()
        for pid in pids:
            try:
                servers.add(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        supervisor.add(self._supervisor)
        workers, jvms = self._spark()
        files, size = self.shared_memory([*pids, *(w.pid for w in workers)])
        return Sample(
            t_s=time.time() - self.started_at,
            server_rss_mib=servers.rss / MIB,
            server_pss_mib=servers.pss / MIB,
            server_fds=servers.fds,
            server_threads=servers.threads,
            servers=len(pids),
            server_pids=pids,
            supervisor_rss_mib=supervisor.rss / MIB,
            supervisor_pss_mib=supervisor.pss / MIB,
            supervisor_fds=supervisor.fds,
            supervisor_threads=supervisor.threads,
            shared_memory_files=files,
            shared_memory_mib=size / MIB,
            restarts=self.restarts(),
            spark_workers_rss_mib=_rss_mib(workers),
            spark_jvm_rss_mib=_rss_mib(jvms),
            jobs_done=self._jobs_done(),
        )


def _note(held: dict[tuple[int, int], int], path: Path) -> None:
    """Record the file at ``path`` (a name, or a ``/proc/<pid>/fd`` link) by its inode, with the
    bytes it holds in memory (a sparse file holds fewer than its size)."""
    try:
        info = path.stat()
    except OSError:  # removed or closed meanwhile
        return
    held[(info.st_dev, info.st_ino)] = info.st_blocks * 512


def _named(process: psutil.Process, name: str) -> bool:
    try:
        return name in process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _rss_mib(processes: Iterable[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total / MIB


# -- trends ------------------------------------------------------------------------------------
MEMORY_SLOPE_LIMIT_MIB_PER_10_MIN = 1.0
COUNT_RISE_LIMIT = 1.0
"""A count (descriptors, threads, files) is flat when its fitted line rises less than one over the
samples after the warm-up, or when no sample after the warm-up exceeds the warm-up's highest."""


@dataclass
class Trend:
    """A measure's samples after the warm-up, and the least-squares line through them."""

    measure: str
    unit: str
    kind: str
    """``memory``: judged by its slope; ``count``: by its rise (see ``COUNT_RISE_LIMIT``)."""
    samples: int
    warm_up_max: float
    after_min: float
    after_max: float
    last: float
    slope_per_10_min: float
    rise: float
    """The fitted line's rise over the samples after the warm-up."""
    flat: bool | None
    """None: fewer than two samples after the warm-up."""


def trend(
    measure: str, unit: str, kind: str, times: Sequence[float], values: Sequence[float], warm_up_s: float
) -> Trend:
    before = [v for t, v in zip(times, values, strict=True) if t < warm_up_s]
    after = [(t, v) for t, v in zip(times, values, strict=True) if t >= warm_up_s]
    warm_up_max = max(before) if before else float("nan")
    if len(after) < 2:
        last = after[-1][1] if after else float("nan")
        return Trend(
            measure, unit, kind, len(after), warm_up_max, last, last, last, float("nan"), float("nan"), None
        )
    xs = np.array([t for t, _ in after])
    ys = np.array([v for _, v in after], dtype=float)
    slope_per_s = float(np.polyfit(xs, ys, 1)[0])
    rise = slope_per_s * float(xs[-1] - xs[0])
    if kind == "memory":
        flat = slope_per_s * 600 < MEMORY_SLOPE_LIMIT_MIB_PER_10_MIN
    else:
        flat = rise < COUNT_RISE_LIMIT or (bool(before) and float(ys.max()) <= warm_up_max)
    return Trend(
        measure, unit, kind, len(after), warm_up_max, float(ys.min()), float(ys.max()), float(ys[-1]),
        slope_per_s * 600, rise, flat,
    )  # fmt: skip
