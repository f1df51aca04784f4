"""TensorFlow, imported once per process, without its start-up chatter, and its GPUs' memory growth.

``import_tensorflow`` is the one way the server, the example generator and the CPU fallback
import the framework: its start-up chatter on stderr (``framework_stderr``) is left out, and one
log line says which device it computes on. The process must be pinned first
(``udfserve.runtime.device.pin_device``): CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when the
framework initialises.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from udfserve.runtime import device
from udfserve.runtime.framework_stderr import ChatterFilter, filtered_stderr, min_log_level

logger = logging.getLogger(__name__)

_tensorflow: Any = None
_import_lock = threading.Lock()


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
    pinned_device = device.pinned_device()
    pinned = f"device {pinned_device}" if pinned_device else "no device pinned"
    if gpus:
        logger.info(
            "tensorflow %s computes on %s (%s, CUDA_VISIBLE_DEVICES=%r)",
            version,
            ", ".join(gpus),
            pinned,
            visible,
        )
    elif pinned_device is not None and pinned_device.startswith("gpu:"):
        logger.warning(
            "tensorflow %s sees no GPU although this process is pinned to %s (CUDA_VISIBLE_DEVICES=%r): it "
            "computes on the CPU; expected a GPU, see the CUDA lines above for why there is none",
            version,
            pinned_device,
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
