"""Pin a process to one device before TensorFlow is imported, then import it: a model server to
its device, the Spark client's CPU fallback to the CPU.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when the framework initialises; setting it later has
no effect, and a process that sees every GPU grabs memory on all of them. This module is the
one place in the server (and in the client's fallback) that changes ``os.environ``, and it
refuses to do so once TensorFlow is in the process, so a mistake in start-up order fails loudly
instead of silently using the wrong device.

``import_tensorflow`` is the one way the server, the example generator and the CPU fallback
import the framework: its start-up chatter on stderr (``framework_stderr``) is left out, and one
log line says which device it computes on.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any

from udfserve.runtime.framework_stderr import ChatterFilter, filtered_stderr, min_log_level

logger = logging.getLogger(__name__)

DEVICE_PATTERN = re.compile(r"^(cpu|gpu:\d+|sim:\d+)$")
"""A device: "cpu", "gpu:N" (NVIDIA device N, in PCI bus order) or "sim:N" (a CPU process that
carries device N's number)."""

_pinned_device: str | None = None
"""The device ``pin_device`` exposed in this process, for the line that names it."""
_tensorflow: Any = None
_import_lock = threading.Lock()


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
    if "tensorflow" in sys.modules:
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


def import_tensorflow() -> Any:
    """TensorFlow, imported once per process, without the start-up lines that are no concern of
    the user; logs the one line that says where it computes (a WARNING when a process pinned to
    a GPU sees none).

    The import and the first look at the devices (where CUDA initialises) happen inside
    ``framework_stderr.filtered_stderr``. Imported before by other code, the framework is taken as
    it is: its lines, if any, are out already.
    """
    global _tensorflow
    with _import_lock:
        if _tensorflow is None:
            if "tensorflow" in sys.modules:
                framework = sys.modules["tensorflow"]
                gpus = framework.config.list_physical_devices("GPU")
            else:
                hidden = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
                chatter = ChatterFilter(min_log_level(os.environ), gpus_hidden=hidden)
                with filtered_stderr(chatter):
                    import tensorflow

                    framework = tensorflow
                    gpus = framework.config.list_physical_devices("GPU")
                logger.debug("left out %d start-up line(s) of tensorflow on stderr", chatter.dropped)
            _announce_device(framework.__version__, [gpu.name for gpu in gpus])
            _tensorflow = framework
    return _tensorflow


def _announce_device(version: str, gpus: list[str]) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    pinned = f"device {_pinned_device}" if _pinned_device else "no device pinned"
    if gpus:
        logger.info(
            "tensorflow %s computes on %s (%s, CUDA_VISIBLE_DEVICES=%r)",
            version,
            ", ".join(gpus),
            pinned,
            visible,
        )
    elif _pinned_device is not None and _pinned_device.startswith("gpu:"):
        logger.warning(
            "tensorflow %s sees no GPU although this process is pinned to %s (CUDA_VISIBLE_DEVICES=%r): it "
            "computes on the CPU; expected a GPU, see the CUDA lines above for why there is none",
            version,
            _pinned_device,
            visible,
        )
    else:
        why = "CUDA_VISIBLE_DEVICES='' hides the GPUs" if visible == "" else "it sees no GPU"
        logger.info("tensorflow %s computes on the CPU (%s; %s)", version, pinned, why)


def enable_memory_growth() -> int:
    """Turn on memory growth for every visible GPU; returns how many GPUs TensorFlow sees.

    Call right after importing TensorFlow. The environment variable set by ``pin_device``
    already asks for growth; this also covers processes started without ``pin_device``
    (the Spark CPU fallback, tests).
    """
    tf = import_tensorflow()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as exc:
            # Raised when the device was already initialised; its setting cannot change now.
            logger.info("memory growth of %s left as it was: %s", gpu.name, exc)
    return len(gpus)
