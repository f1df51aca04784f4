"""Where a booster computes: the GPU of a process pinned to one, else the CPU, said once.

A process pinned to ``gpu:N`` (``device.pin_device``, which leaves that GPU as CUDA device 0)
predicts with ``device=cuda:0``. ``inplace_predict`` is in place only for data on the booster's
device: given numpy rows, a CUDA booster copies them into a DMatrix at every call (and says so
in a warning per call). So the rows go to the GPU through cupy (one host-to-device copy, the one
any GPU computation needs), the answers come back the same way, and XGBoost copies nothing more.

Where that cannot be, the booster computes on the CPU, with one WARNING per model naming why:
the installed xgboost has no CUDA (PyPI's ``xgboost-cpu``, or a build without it), cupy is not
installed, or the first call on the GPU failed (no usable device, CUDA libraries missing). Any
other process (``cpu``, ``sim:N``, the Spark CPU fallback, a script) computes on the CPU.

Threads (``settings.call_threads``) apply on the CPU; on the GPU XGBoost runs its own kernels.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgboost

from udfserve.runtime import device

logger = logging.getLogger(__name__)

CPU = "cpu"
CUDA = "cuda:0"
"""The one GPU ``pin_device`` leaves visible."""


@dataclass(frozen=True)
class Placement:
    """The device a booster computes on, and why a GPU-pinned process's is the CPU ("" otherwise)."""

    device: str
    why_cpu: str = ""


def xgboost_has_cuda() -> bool:
    """Whether the installed xgboost was built with CUDA (PyPI's ``xgboost-cpu`` was not)."""
    return bool(xgboost.build_info().get("USE_CUDA"))


def cupy_installed() -> bool:
    """Whether cupy, which hands rows to the GPU, can be imported here (found, not imported)."""
    return importlib.util.find_spec("cupy") is not None


def choose(pinned: str | None, has_cuda: bool, has_cupy: bool) -> Placement:
    """The device for a process pinned to ``pinned``, before any call has been tried."""
    if pinned is None or not pinned.startswith("gpu:"):
        return Placement(CPU)
    if not has_cuda:
        return Placement(
            CPU,
            f"this xgboost {xgboost.__version__} has no CUDA (the xgboost-cpu build, or one built without "
            "it); expected the xgboost package (`pip install 'udfserve[xgboost]'`) for a GPU",
        )
    if not has_cupy:
        return Placement(
            CPU,
            "cupy is not installed, and without it every call would copy its rows into a DMatrix; "
            "expected cupy for this CUDA (`pip install cupy-cuda12x`)",
        )
    return Placement(CUDA)


def place(booster: Any, num_features: int, what: str) -> Placement:
    """Set the booster's device for this process and return it: the GPU when ``choose`` allows
    and a one-row call runs there, else the CPU with one WARNING naming ``what`` and why."""
    chosen = choose(device.pinned_device(), xgboost_has_cuda(), cupy_installed())
    if chosen.device == CUDA:
        booster.set_param({"device": CUDA})
        try:
            predict(booster, np.zeros((1, num_features), dtype=np.float32), CUDA)
        except Exception as exc:  # cupy's and XGBoost's errors alike: the GPU is not usable
            chosen = Placement(CPU, f"its first call on {CUDA} failed: {type(exc).__name__}: {exc}")
    if chosen.device == CPU:
        booster.set_param({"device": CPU})
    if chosen.why_cpu:
        logger.warning(
            "%s runs on the CPU although this process is pinned to %s: %s",
            what,
            device.pinned_device(),
            chosen.why_cpu,
        )
    return chosen


def predict(booster: Any, features: np.ndarray, on: str) -> np.ndarray:
    """``inplace_predict`` of ``features`` (NaN is missing) on device ``on``; the answer in numpy."""
    if on == CPU:
        result: np.ndarray = booster.inplace_predict(features, validate_features=False)
        return result
    cupy = importlib.import_module("cupy")
    answered = booster.inplace_predict(cupy.asarray(features), validate_features=False)
    result = cupy.asnumpy(answered)
    return result
