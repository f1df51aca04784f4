"""Pin a process to one device before TensorFlow is imported, then import it: a model server to
its device, the Spark client's CPU fallback to the CPU.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when the framework initialises; setting it later has
no effect, and a process that sees every GPU grabs memory on all of them. This module is the
one place in the server (and in the client's fallback) that changes ``os.environ``, and it
refuses to do so once TensorFlow is in the process, so a mistake in start-up order fails loudly
instead of silently using the wrong device.

TensorFlow itself is imported by its backend (``backends.tensorflow.framework``), after the pin.
"""

from __future__ import annotations

import logging
import os
import re
import sys

logger = logging.getLogger(__name__)

DEVICE_PATTERN = re.compile(r"^(cpu|gpu:\d+|sim:\d+)$")
"""A device: "cpu", "gpu:N" (NVIDIA device N, in PCI bus order) or "sim:N" (a CPU process that
carries device N's number)."""

_pinned_device: str | None = None
"""The device ``pin_device`` exposed in this process, for the line that names it."""


def visible_devices_for(device: str) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that exposes exactly ``device`` ("" hides every GPU)."""
    if not DEVICE_PATTERN.match(device):
        raise ValueError(f'invalid device {device!r}; expected "cpu", "gpu:N" or "sim:N" (e.g. gpu:0)')
    # A simulated device ("sim:N") is a CPU process that only carries the device's number.
    return device.split(":", 1)[1] if device.startswith("gpu:") else ""


def pin_device(device: str) -> None:
    """Expose only ``device`` to the framework, with GPU memory growth on and quiet C++ logs.

    Must run before ``import tensorflow``: afterwards the device list is fixed for the process.
    """
    visible = visible_devices_for(device)
    # None in sys.modules marks a module that cannot be imported here, not one that was
    if sys.modules.get("tensorflow") is not None:
        raise RuntimeError(
            f"cannot pin the process to {device!r}: tensorflow is already imported, so "
            "CUDA_VISIBLE_DEVICES would be ignored; call pin_device before importing tensorflow"
        )
    # CUDA numbers devices fastest-first by default; NVML, nvidia-smi and Spark's discovery
    # script number them by PCI bus. Same order here, so gpu:N is the device they call N.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    # Memory growth lets several models (and the CUDA context) share one device without one
    # allocation up front reserving all of it.
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    global _pinned_device
    _pinned_device = device
    logger.debug("pinned to device %s (CUDA_VISIBLE_DEVICES=%r)", device, visible)


def pinned_device() -> str | None:
    """The device ``pin_device`` exposed in this process; None when it was never called (a test,
    a script): backends other than TensorFlow choose their execution device from it."""
    return _pinned_device
