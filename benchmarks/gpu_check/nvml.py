"""What the check itself reads from NVML, to compare with what udfserve reports.

NVML is a monitoring library: reading it initialises no CUDA context, so the check's own process
stays off the GPU. Every function answers None (or nothing) where NVML is unavailable, as the
server's gauges are absent rather than zero there.
"""

from __future__ import annotations

from typing import Any

from udfserve.services.model_server.observability.gpu_metrics import nvml_status
from udfserve.services.node.devices import GpuDetection, detect_gpus


def detection() -> GpuDetection:
    """The node's NVIDIA devices as the node supervisor finds them (its own function)."""
    return detect_gpus()


def _handle(index: int) -> Any:
    if not nvml_status().available:
        return None
    import pynvml

    return pynvml.nvmlDeviceGetHandleByIndex(index)


def memory_used_bytes(index: int = 0) -> int | None:
    """Device memory in use, every process's."""
    handle = _handle(index)
    if handle is None:
        return None
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def utilisation_ratio(index: int = 0) -> float | None:
    """The share of NVML's last sample period in which a kernel ran, 0 to 1."""
    handle = _handle(index)
    if handle is None:
        return None
    import pynvml

    return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0


def compute_processes(index: int = 0) -> dict[int, int]:
    """pid -> device memory of the processes holding a CUDA context on the device. In a container
    NVML may report the host's pids, which then match none of the container's."""
    handle = _handle(index)
    if handle is None:
        return {}
    import pynvml

    return {
        int(p.pid): int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    }


def describe() -> str:
    """The GPU line of the machine description."""
    found = detection()
    if not found.gpus:
        return found.describe()
    status = nvml_status()
    return f"{found.describe()}, driver {status.driver_version}"
