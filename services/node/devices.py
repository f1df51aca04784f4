"""Which devices the node serves on: NVIDIA GPUs found through NVML, or what ``--devices`` says.

``--devices`` accepts, besides ``auto`` (the default: one server per GPU NVML finds, else one
CPU server):

- ``cpu``: one server on the CPU;
- ``0,1`` (or ``gpu:0,gpu:1``): real GPUs by NVML index, each server pinned with
  ``CUDA_VISIBLE_DEVICES``; every index must exist;
- ``sim:0,sim:1``: simulated devices, for nodes without GPUs. Each is a CPU process
  (``--device sim:N`` hides CUDA) announced in the discovery file and the metrics as device
  index N, so per-device routing, pinning and restarts run for real without a GPU.

Kinds are not mixed in one list: a node serves either its GPUs, simulated devices or the CPU.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from udfserve.services.model_server.observability.gpu_metrics import nvml_status

logger = logging.getLogger(__name__)

_GPU_ITEM = re.compile(r"^(?:gpu:)?(\d+)$")
_SIM_ITEM = re.compile(r"^sim:(\d+)$")
DEVICES_SYNTAX = 'expected "auto", "cpu", GPU indices like "0,1" (or "gpu:0,gpu:1"), or "sim:0,sim:1"'


class DeviceError(ValueError):
    """``--devices`` is malformed or names a GPU that NVML does not know."""


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA device as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuDetection:
    """The outcome of asking NVML; ``reason`` says why no device was found ("" if NVML answered)."""

    gpus: tuple[GpuInfo, ...]
    reason: str

    @property
    def count(self) -> int:
        return len(self.gpus)

    def describe(self) -> str:
        if self.gpus:
            return ", ".join(f"{g.index}: {g.name} ({g.uuid})" for g in self.gpus)
        return f"no NVIDIA device ({self.reason or 'NVML reports 0 devices'})"


@dataclass(frozen=True)
class DeviceSlot:
    """One model server to run: the device it is pinned to and how it is announced."""

    device: str  # the server's --device: "cpu", "gpu:N" or "sim:N"
    index: int | None = None  # device_index in the discovery file and the metrics labels
    uuid: str | None = None
    name: str | None = None

    @property
    def slug(self) -> str:
        """The device as it appears in file names: cpu, gpu0, sim1."""
        return self.device.replace(":", "")


def detect_gpus() -> GpuDetection:
    """List the node's NVIDIA devices through NVML; no library or no driver means none, with the reason."""
    status = nvml_status()
    if not status.available:
        return GpuDetection((), status.reason)
    import pynvml

    gpus = []
    for index in range(status.device_count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        except pynvml.NVMLError as exc:
            # A device that NVML lists but cannot describe (fallen off the bus, lost) is not served.
            logger.warning("NVML cannot read device %d, leaving it out: %s", index, exc)
    return GpuDetection(tuple(gpus), "" if gpus else "NVML reports 0 usable devices")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def check_devices_syntax(spec: str) -> str:
    """Validate ``--devices`` without asking NVML; returns it normalised (lower case, no spaces)."""
    _parse(spec)
    return spec.strip().lower().replace(" ", "")


def _parse(spec: str) -> tuple[str, tuple[int, ...]]:
    text = spec.strip().lower().replace(" ", "")
    if text in {"", "auto"}:
        return "auto", ()
    if text == "cpu":
        return "cpu", ()
    items = text.split(",")
    for kind, pattern in (("gpu", _GPU_ITEM), ("sim", _SIM_ITEM)):
        matches = [pattern.match(item) for item in items]
        if all(matches):
            indices = tuple(int(m.group(1)) for m in matches if m)
            duplicates = sorted({i for i in indices if indices.count(i) > 1})
            if duplicates:
                raise DeviceError(f"--devices {spec!r} lists device {duplicates[0]} twice")
            return kind, indices
    raise DeviceError(f"invalid --devices {spec!r}: {DEVICES_SYNTAX}")


def plan_devices(spec: str, detection: GpuDetection) -> list[DeviceSlot]:
    """The servers to run for ``--devices spec`` on a node where NVML found ``detection``."""
    kind, indices = _parse(spec)
    if kind == "cpu" or (kind == "auto" and not detection.gpus):
        return [DeviceSlot("cpu")]
    if kind == "auto":
        return [DeviceSlot(f"gpu:{g.index}", g.index, g.uuid, g.name) for g in detection.gpus]
    if kind == "sim":
        return [DeviceSlot(f"sim:{i}", i, None, "simulated (CPU)") for i in indices]
    by_index = {g.index: g for g in detection.gpus}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise DeviceError(
            f"--devices {spec!r} names GPU {missing[0]}, which this node does not have: "
            f"{detection.describe()}; use sim:N for simulated devices on a node without GPUs"
        )
    return [DeviceSlot(f"gpu:{i}", i, by_index[i].uuid, by_index[i].name) for i in indices]
