"""GPU figures from NVML, read when Prometheus scrapes, for the device this server is pinned to.

Each model server exports the gauges of its own device only, so with one scrape target per
server (see ``docs/node.md``) every device is reported exactly once. NVML sees every GPU of
the node whatever ``CUDA_VISIBLE_DEVICES`` says; the device is therefore looked up by its
uuid when the supervisor passed one (``--device-uuid``), else by its index (``gpu:N``; the
server pins CUDA to PCI bus order so the two numberings agree).

On a node without the NVML library or without NVIDIA devices the per-device gauges are
absent, not zero: a zero would read as an idle GPU. ``udfserve_gpu_devices`` always reports
how many devices NVML found (0 when it could not be initialised). NVML is initialised once
per process and the outcome, failure included, is remembered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

DEVICE_LABELS = ["device_index", "device_uuid"]


@dataclass(frozen=True)
class NvmlStatus:
    """What NVML said when this process initialised it."""

    available: bool
    device_count: int
    reason: str  # why NVML is unavailable; "" when it is
    driver_version: str | None = None


_status: NvmlStatus | None = None
_status_lock = threading.Lock()


def nvml_status() -> NvmlStatus:
    """Initialise NVML the first time it is asked for in this process; return the remembered outcome.

    Failures come from the nvidia-ml-py library itself (``NVMLError_LibraryNotFound`` where no
    driver is installed, ``NVMLError_DriverNotLoaded``, ...); they are logged once, here.
    """
    global _status
    with _status_lock:
        if _status is None:
            _status = _initialise_nvml()
            if _status.available:
                logger.info(
                    "NVML: %d NVIDIA device(s), driver %s", _status.device_count, _status.driver_version
                )
            else:
                logger.info("NVML unavailable, no GPU figures will be exported: %s", _status.reason)
        return _status


def _initialise_nvml() -> NvmlStatus:
    try:
        import pynvml
    except ImportError as exc:
        return NvmlStatus(False, 0, f"nvidia-ml-py is not installed ({exc})")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlStatus(False, 0, f"nvmlInit failed: {type(exc).__name__}: {exc}")
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as exc:
        return NvmlStatus(False, 0, f"NVML initialised but cannot list devices: {type(exc).__name__}: {exc}")
    return NvmlStatus(True, count, "", driver)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class _PinnedDevice:
    handle: Any
    index: str
    uuid: str


class GpuCollector(Collector):
    """Per-device gauges for the GPU of a server pinned to ``device`` ("gpu:N"); none for cpu/sim."""

    def __init__(self, device: str, device_uuid: str | None = None) -> None:
        self.device = device
        self.device_uuid = device_uuid
        self._pinned: _PinnedDevice | None = None
        self._resolved = False
        self._lock = threading.Lock()
        self._failed_readings: set[str] = set()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("udfserve_gpu_devices", "NVIDIA devices NVML found on the node.")
        for name, documentation, _ in _READINGS:
            yield GaugeMetricFamily(name, documentation, labels=DEVICE_LABELS)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = nvml_status()
        yield GaugeMetricFamily(
            "udfserve_gpu_devices",
            "NVIDIA devices NVML found on the node (0 without the NVML library or a driver).",
            value=status.device_count,
        )
        pinned = self._pinned_device() if status.available else None
        if pinned is None:
            return
        import pynvml

        labels = [pinned.index, pinned.uuid]
        for name, documentation, read in _READINGS:
            try:
                value = read(pynvml, pinned.handle)
            except pynvml.NVMLError as exc:
                # Some boards do not report every figure (power on many consumer GPUs): the
                # gauge is left out rather than reported as zero.
                if name not in self._failed_readings:
                    self._failed_readings.add(name)
                    logger.info("NVML cannot read %s for device %s: %s", name, pinned.index, exc)
                continue
            family = GaugeMetricFamily(name, documentation, labels=DEVICE_LABELS)
            family.add_metric(labels, value)
            yield family

    def _pinned_device(self) -> _PinnedDevice | None:
        with self._lock:
            if not self._resolved:
                self._resolved = True
                self._pinned = self._resolve()
            return self._pinned

    def _resolve(self) -> _PinnedDevice | None:
        if not self.device.startswith("gpu:"):
            return None
        import pynvml

        try:
            if self.device_uuid:
                handle = pynvml.nvmlDeviceGetHandleByUUID(self.device_uuid)
                index = str(pynvml.nvmlDeviceGetIndex(handle))
            else:
                index = self.device.split(":", 1)[1]
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(index))
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            logger.warning(
                "NVML has no device %s (uuid %s): no GPU figures will be exported: %s",
                self.device,
                self.device_uuid or "not given",
                exc,
            )
            return None
        return _PinnedDevice(handle=handle, index=index, uuid=uuid)


def _utilization_ratio(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0  # NVML reports a percentage


def _memory_used_bytes(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _memory_total_bytes(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetMemoryInfo(handle).total)


def _power_watts(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # NVML reports milliwatts


def _temperature_celsius(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))


_READINGS: tuple[tuple[str, str, Callable[[Any, Any], float]], ...] = (
    (
        "udfserve_gpu_utilization_ratio",
        "Share of the last sample period (0 to 1) during which a kernel ran on the device.",
        _utilization_ratio,
    ),
    ("udfserve_gpu_memory_used_bytes", "Device memory allocated, all processes.", _memory_used_bytes),
    ("udfserve_gpu_memory_total_bytes", "Device memory installed.", _memory_total_bytes),
    ("udfserve_gpu_power_watts", "Power drawn by the board.", _power_watts),
    ("udfserve_gpu_temperature_celsius", "Temperature of the GPU die.", _temperature_celsius),
)
