"""The GPU collector of a model server on a node without NVML: a device count of 0, nothing faked."""

from __future__ import annotations

import ctypes

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from udfserve.services.model_server.observability.gpu_metrics import GpuCollector, nvml_status


def nvml_library_installed() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(nvml_library_installed(), reason="this node has the NVML library")


def exposition(device: str, device_uuid: str | None = None) -> str:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GpuCollector(device, device_uuid))
    return generate_latest(registry).decode()


def test_nvml_failure_comes_from_nvidia_ml_py_and_is_remembered() -> None:
    first = nvml_status()

    assert not first.available
    assert first.device_count == 0
    assert "NVMLError_LibraryNotFound" in first.reason
    assert nvml_status() is first


@pytest.mark.parametrize(("device", "uuid"), [("gpu:0", None), ("gpu:1", "GPU-1234"), ("sim:0", None)])
def test_without_nvml_only_the_device_count_is_exported(device: str, uuid: str | None) -> None:
    text = exposition(device, uuid)

    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples == ["udfserve_gpu_devices 0.0"]
    assert "udfserve_gpu_memory_used_bytes" not in text
    assert "udfserve_gpu_utilization_ratio" not in text
