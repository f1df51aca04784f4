"""The memory a cluster run used: sampled on the host until SIGTERM, then written as JSON.

  python3 deploy/cluster/memory_peak.py --project-prefix udfserve-cluster --out FILE [--interval-s 2]
  python3 deploy/cluster/memory_peak.py --report FILE      one line saying what FILE holds

Every interval: the working set of each running container of a compose project whose name starts
with the prefix (its memory cgroup's usage less its inactive file cache, which is what `docker stats`
shows), their sum, and the machine's used memory (MemTotal - MemAvailable, everything on the host,
the engine and other work included). The peaks are of these samples; a spike shorter than the
interval can be missed, so each container's own peak as its cgroup recorded it is kept too
(cgroup v1 memory.max_usage_in_bytes, v2 memory.peak, which count its page cache as well).
Runs on the host with the Python standard library; reads the containers' cgroups through /proc.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

CGROUP = Path("/sys/fs/cgroup")


def meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0]) * 1024
    return values


def memory_cgroup(pid: int) -> Path | None:
    """The folder of the memory cgroup of ``pid`` (v1 controller, else the v2 unified one)."""
    unified = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP / "memory" / path.lstrip("/")
        if controllers == "":
            unified = path
    if unified is None:
        return None
    for root in (CGROUP, CGROUP / "unified"):
        if (root / unified.lstrip("/") / "memory.current").exists():
            return root / unified.lstrip("/")
    return None


def stat(folder: Path, name: str) -> int:
    for line in (folder / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def working_set(folder: Path) -> tuple[int, int]:
    """(usage less inactive file cache, the cgroup's own peak of usage)."""
    if (folder / "memory.current").exists():  # v2
        usage = int((folder / "memory.current").read_text())
        peak_file = folder / "memory.peak"
        peak = int(peak_file.read_text()) if peak_file.exists() else usage
        return usage - stat(folder, "inactive_file"), peak
    usage = int((folder / "memory.usage_in_bytes").read_text())
    peak = int((folder / "memory.max_usage_in_bytes").read_text())
    return usage - stat(folder, "total_inactive_file"), peak


class Sampler:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.cgroups: dict[str, tuple[str, Path | None]] = {}
        self.samples = 0
        self.cluster_peak = (0, 0.0, 0)
        self.machine_peak = (0, 0.0)
        self.container_peak: dict[str, int] = {}
        self.cgroup_peak: dict[str, int] = {}
        self.started = time.time()

    def containers(self) -> dict[str, str]:
        listed = subprocess.run(
            ["docker", "ps", "--format", '{{.ID}}\t{{.Names}}\t{{.Label "com.docker.compose.project"}}'],
            capture_output=True,
            text=True,
            check=False,
            timeout=20,
        ).stdout
        found = {}
        for line in listed.splitlines():
            ident, name, project = [*line.split("\t"), "", ""][:3]
            if project.startswith(self.prefix):
                found[ident] = name
        return found

    def cgroup_of(self, ident: str, name: str) -> Path | None:
        if ident not in self.cgroups:
            pid = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", ident],
                capture_output=True,
                text=True,
                check=False,
                timeout=20,
            ).stdout.strip()
            try:
                folder = memory_cgroup(int(pid)) if pid and pid != "0" else None
            except (OSError, ValueError):
                folder = None
            self.cgroups[ident] = (name, folder)
        return self.cgroups[ident][1]

    def sample(self) -> None:
        total = 0
        running = 0
        for ident, name in self.containers().items():
            folder = self.cgroup_of(ident, name)
            if folder is None:
                continue
            try:
                used, peak = working_set(folder)
            except (OSError, ValueError):
                continue
            running += 1
            total += used
            self.container_peak[name] = max(self.container_peak.get(name, 0), used)
            self.cgroup_peak[name] = max(self.cgroup_peak.get(name, 0), peak)
        now = time.time()
        if total > self.cluster_peak[0]:
            self.cluster_peak = (total, now, running)
        info = meminfo()
        used = info["MemTotal"] - info["MemAvailable"]
        if used > self.machine_peak[0]:
            self.machine_peak = (used, now)
        self.samples += 1

    def summary(self) -> dict[str, Any]:
        info = meminfo()
        return {
            "samples": self.samples,
            "seconds": round(time.time() - self.started),
            "cluster_peak_bytes": self.cluster_peak[0],
            "cluster_peak_after_s": round(self.cluster_peak[1] - self.started) if self.samples else 0,
            "cluster_peak_containers": self.cluster_peak[2],
            "machine_peak_used_bytes": self.machine_peak[0],
            "machine_total_bytes": info["MemTotal"],
            "container_peak_bytes": dict(sorted(self.container_peak.items())),
            "container_cgroup_peak_bytes": dict(sorted(self.cgroup_peak.items())),
        }


def report(summary: dict[str, Any]) -> str:
    def gib(value: int) -> str:
        return f"{value / 2**30:.1f} GiB"

    largest = sorted(summary["container_peak_bytes"].items(), key=lambda item: -item[1])[:6]
    return (
        f"peak memory: the cluster's containers {gib(summary['cluster_peak_bytes'])} together "
        f"({summary['cluster_peak_containers']} containers, {summary['cluster_peak_after_s']} s into the "
        f"sampling), the machine {gib(summary['machine_peak_used_bytes'])} used of "
        f"{gib(summary['machine_total_bytes'])} (other work included); largest containers: "
        + ", ".join(f"{name} {gib(value)}" for name, value in largest)
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project-prefix")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--interval-s", type=float, default=2.0)
    parser.add_argument("--report", type=Path, help="print one line about a summary written before")
    args = parser.parse_args(argv)
    if args.report:
        sys.stdout.write(report(json.loads(args.report.read_text())) + "\n")
        return 0
    if not (args.project_prefix and args.out):
        parser.error("sampling needs --project-prefix and --out")
    sampler = Sampler(args.project_prefix)
    stopping = False

    def stop(_signal: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        # The engine busy or going away: the next sample tries again.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            sampler.sample()
        deadline = time.monotonic() + args.interval_s
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
    args.out.write_text(json.dumps(sampler.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
