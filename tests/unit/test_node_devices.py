"""Device detection through NVML and the plan of servers ``--devices`` asks for."""

from __future__ import annotations

import ctypes

import pytest

from udfserve.services.node.devices import (
    DeviceError,
    DeviceSlot,
    GpuDetection,
    GpuInfo,
    check_devices_syntax,
    detect_gpus,
    plan_devices,
)


def nvml_library_installed() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


NO_GPU = GpuDetection((), "nvmlInit failed: NVMLError_LibraryNotFound: NVML Shared Library Not Found")
TWO_GPUS = GpuDetection(
    (
        GpuInfo(0, "GPU-aaaa", "NVIDIA A10", 24 << 30),
        GpuInfo(1, "GPU-bbbb", "NVIDIA A10", 24 << 30),
    ),
    "",
)


@pytest.mark.skipif(nvml_library_installed(), reason="this node has the NVML library")
def test_without_the_nvml_library_detection_finds_no_device_and_records_why() -> None:
    detection = detect_gpus()  # the real nvidia-ml-py: nvmlInit raises NVMLError_LibraryNotFound here

    assert detection.gpus == ()
    assert detection.count == 0
    assert "NVMLError_LibraryNotFound" in detection.reason
    assert detection.reason in detection.describe()


@pytest.mark.skipif(nvml_library_installed(), reason="this node has the NVML library")
def test_auto_on_a_node_without_nvml_runs_one_cpu_server() -> None:
    assert plan_devices("auto", detect_gpus()) == [DeviceSlot("cpu")]


def test_auto_runs_one_server_per_detected_gpu_with_its_uuid() -> None:
    assert plan_devices("auto", TWO_GPUS) == [
        DeviceSlot("gpu:0", 0, "GPU-aaaa", "NVIDIA A10"),
        DeviceSlot("gpu:1", 1, "GPU-bbbb", "NVIDIA A10"),
    ]


def test_cpu_runs_one_cpu_server_even_on_a_gpu_node() -> None:
    assert plan_devices("cpu", TWO_GPUS) == [DeviceSlot("cpu")]


@pytest.mark.parametrize("spec", ["1", "gpu:1", " GPU:1 "])
def test_gpu_indices_pick_those_gpus(spec: str) -> None:
    assert plan_devices(spec, TWO_GPUS) == [DeviceSlot("gpu:1", 1, "GPU-bbbb", "NVIDIA A10")]


def test_a_gpu_index_the_node_lacks_is_refused_naming_it_and_the_gpus_it_has() -> None:
    with pytest.raises(DeviceError, match=r"names GPU 2, which this node does not have: 0: NVIDIA A10"):
        plan_devices("0,2", TWO_GPUS)


def test_a_gpu_index_on_a_node_without_nvml_is_refused_naming_why_and_the_simulated_alternative() -> None:
    with pytest.raises(DeviceError, match=r"names GPU 0, which this node does not have") as error:
        plan_devices("0", NO_GPU)
    assert "NVMLError_LibraryNotFound" in str(error.value)
    assert "sim:N" in str(error.value)


def test_simulated_devices_are_cpu_servers_announced_with_their_index() -> None:
    slots = plan_devices("sim:0,sim:3", NO_GPU)

    assert [(s.device, s.index, s.uuid) for s in slots] == [("sim:0", 0, None), ("sim:3", 3, None)]
    assert [s.slug for s in slots] == ["sim0", "sim3"]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("0,sim:1", "invalid --devices"),
        ("cpu,0", "invalid --devices"),
        ("sim:a", "invalid --devices"),
        ("gpu0", "invalid --devices"),
        ("sim:1,sim:1", "lists device 1 twice"),
    ],
)
def test_malformed_devices_are_refused(spec: str, problem: str) -> None:
    with pytest.raises(DeviceError, match=problem):
        check_devices_syntax(spec)


def test_devices_syntax_is_normalised() -> None:
    assert check_devices_syntax(" SIM:0, sim:1 ") == "sim:0,sim:1"
