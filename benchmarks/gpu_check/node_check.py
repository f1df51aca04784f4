"""The check of ``udfserve node --devices auto``: the GPU found through NVML, listed in the
discovery file, and its gauges in the server's ``/metrics`` carrying NVML's figures.

The node is started as the demo starts it (``services/demo_node.running_node``: a private runtime
folder, free ports) and kept running for the executors' checks that follow. Without NVML (the dry
run) the node serves one server on the CPU and the GPU gauges must be absent, not zero.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from benchmarks.gpu_check import nvml
from benchmarks.gpu_check.models import HEAVY, MLP, NULL
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.results import Report, holds, mib, skipped
from benchmarks.processes import metric_value
from udfserve.discovery import NodeDiscovery, ServerEntry, read_discovery
from udfserve.services.demo_node import StartedNode, running_node
from udfserve.services.node.devices import GpuDetection

NODE_MODELS = (MLP, NULL, HEAVY)
GAUGES = (
    "udfserve_gpu_memory_used_bytes",
    "udfserve_gpu_memory_total_bytes",
    "udfserve_gpu_utilization_ratio",
    "udfserve_gpu_temperature_celsius",
    "udfserve_gpu_power_watts",
)


@contextlib.contextmanager
def node_for(repository: Path) -> Iterator[tuple[StartedNode, NodeDiscovery]]:
    """``udfserve node --devices auto`` serving the executors' models, once every server is ready."""
    flags = ["--models", ",".join(NODE_MODELS), "--log-level", "INFO", "--log-format", "json"]
    with running_node(repository, "auto", start_timeout_s=300, extra_args=flags) as node:
        yield node, read_discovery(node.discovery_file)


def server_metrics(server: ServerEntry) -> str:
    with urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10) as response:
        return str(response.read().decode())


def present(text: str, name: str) -> bool:
    return any(line.startswith((f"{name}{{", f"{name} ")) for line in text.splitlines())


def check_node(plan: Plan, discovery: NodeDiscovery, report: Report) -> None:
    found = nvml.detection()
    if plan.device == "gpu":
        report.add(
            "node",
            "NVML finds the GPU",
            found.describe(),
            holds(found.count >= 1),
            "services/node/devices.detect_gpus, what --devices auto starts a server for",
        )
    else:
        report.add(
            "node",
            "NVML finds the GPU",
            found.describe(),
            skipped("no NVIDIA driver here"),
            "--devices auto then starts one server on the CPU",
        )
    _check_discovery(plan, discovery, found, report)
    if discovery.servers:
        _check_gauges(plan, discovery.servers[0], found, report)


def _check_discovery(plan: Plan, discovery: NodeDiscovery, found: GpuDetection, report: Report) -> None:
    servers = discovery.servers
    listed = "; ".join(
        f"{s.device} (index {s.device_index}, uuid {s.device_uuid}) {s.state}, models {sorted(s.models)}"
        for s in servers
    )
    expected: list[tuple[str, int | None, str | None]]
    if plan.device == "gpu":
        expected = [(f"gpu:{g.index}", g.index, g.uuid) for g in found.gpus]
        why = "one server per GPU, each with NVML's index and uuid"
    else:
        expected = [("cpu", None, None)]
        why = "no GPU: one server on the CPU, with no index or uuid"
    actual = [(s.device, s.device_index, s.device_uuid) for s in servers]
    models_ready = all(s.state == "ready" and set(NODE_MODELS) <= set(s.models) for s in servers)
    report.add(
        "node",
        "the discovery file lists",
        listed or "no server",
        holds(actual == expected and models_ready),
        f"{why}; every server ready with {', '.join(NODE_MODELS)}",
    )


def _check_gauges(plan: Plan, server: ServerEntry, found: GpuDetection, report: Report) -> None:
    text = server_metrics(server)
    devices = metric_value(text, "udfserve_gpu_devices")
    if plan.device != "gpu":
        absent = [name for name in GAUGES if not present(text, name)]
        report.add(
            "node",
            "GPU gauges in the server's /metrics",
            f"udfserve_gpu_devices {devices:.0f}; {len(absent)} of {len(GAUGES)} per-device gauges absent",
            holds(len(absent) == len(GAUGES) and devices == 0),
            "absent, not zero, where NVML is unavailable",
        )
        return
    values = {name: metric_value(text, name, device_index=str(server.device_index)) for name in GAUGES}
    missing = [name for name in GAUGES if not present(text, name)]
    total = found.gpus[0].memory_total_bytes if found.gpus else 0
    used, total_reported, utilisation, temperature, power = (values[name] for name in GAUGES)
    plausible = (
        not missing
        and devices == found.count
        and 0 < used <= total_reported
        and total_reported == total
        and 0.0 <= utilisation <= 1.0
        and 0 < temperature < 120
        and 0 < power < 2000
    )
    report.add(
        "node",
        "GPU gauges in the server's /metrics",
        f"memory {mib(used)} of {mib(total_reported)}, utilisation {utilisation:.2f}, "
        f"{temperature:.0f} °C, {power:.0f} W; udfserve_gpu_devices {devices:.0f}",
        holds(plausible),
        f"NVML says {mib(total)} installed" + (f"; missing: {', '.join(missing)}" if missing else ""),
    )
