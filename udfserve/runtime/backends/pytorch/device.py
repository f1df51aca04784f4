"""Where PyTorch computes and with how many threads, settled once per process before a model loads.

The device: a process pinned to ``gpu:N`` (``device.pin_device``) sees exactly that GPU as
CUDA device 0, so a model goes to ``cuda:0`` when CUDA is available; otherwise it computes on
the CPU, said in one WARNING line when the process was pinned to a GPU (expected one, got none)
and one INFO line otherwise. On a GPU, ``UDFSERVE_TORCH_CUDA_MEMORY_FRACTION`` caps the share of
the device's memory this process's caching allocator may take (``torch.cuda.
set_per_process_memory_fraction``): a larger allocation fails as out-of-memory, which the batcher
splits on, instead of growing into memory another process on the device needs.

The CPU threads follow the TensorFlow backend's rule (``tensorflow._set_up_threads``): intra-op
one core short of the process's cores (the event loop answering gRPC needs the last one), inter-op
one per core (large calls run as concurrent parts, ``cpu_parallel``). ``OMP_NUM_THREADS`` or
``MKL_NUM_THREADS`` in the environment win, as they do for torch itself.

The backend's settings (``TorchSettings``) are read with the placement, once per process; besides
the memory fraction they bound what a model file may unpack to (``zip_entries``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import torch
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from udfserve.runtime import device
from udfserve.runtime.backends.pytorch.zip_entries import UNPACKED_CEILING_BYTES
from udfserve.runtime.errors import ModelLoadError

logger = logging.getLogger(__name__)

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Torch's own settings of its CPU thread pool; when either is set, it decides."""


SETTINGS_PREFIX = "UDFSERVE_TORCH_"


class TorchSettings(BaseSettings):
    """The PyTorch backend's settings, from ``UDFSERVE_TORCH_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix=SETTINGS_PREFIX, extra="ignore", frozen=True)

    cuda_memory_fraction: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="on a GPU, the share of the device's memory this process may allocate (0-1]; "
        "default no cap",
    )
    max_unpacked_bytes: int | None = Field(
        default=None,
        ge=1,
        le=UNPACKED_CEILING_BYTES,
        description="the most bytes a model file may unpack to, all its zip entries together (at most "
        "1 TiB); default twice the file's size plus 64 MiB",
    )


@dataclass(frozen=True)
class TorchPlacement:
    """Where models of this process compute, and the settings it was chosen with."""

    device: torch.device
    settings: TorchSettings

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


_placement: TorchPlacement | None = None
_lock = threading.Lock()


def placement() -> TorchPlacement:
    """The device and thread pools of this process, chosen on the first call and logged once."""
    global _placement
    with _lock:
        if _placement is None:
            settings = _settings()
            _set_up_threads()
            _placement = _choose_device(settings)
    return _placement


def _settings() -> TorchSettings:
    try:
        return TorchSettings()
    except ValidationError as exc:
        wrong = "; ".join(
            f"{SETTINGS_PREFIX}{str(error['loc'][0]).upper()}={error.get('input')!r}: {error['msg']}"
            for error in exc.errors()
        )
        raise ModelLoadError(f"the PyTorch backend's settings are invalid: {wrong}") from exc


def _choose_device(settings: TorchSettings) -> TorchPlacement:
    pinned = device.pinned_device()
    if torch.cuda.is_available():
        chosen = torch.device("cuda", 0)
        if settings.cuda_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(settings.cuda_memory_fraction, 0)
        logger.info(
            "torch %s computes on cuda:0 (%s, %s; memory cap %s)",
            torch.__version__,
            torch.cuda.get_device_name(0),
            f"device {pinned}" if pinned else "no device pinned",
            "none" if settings.cuda_memory_fraction is None else f"{settings.cuda_memory_fraction:.0%}",
        )
        return TorchPlacement(chosen, settings)
    if pinned is not None and pinned.startswith("gpu:"):
        logger.warning(
            "torch %s sees no CUDA device although this process is pinned to %s: it computes on the CPU; "
            "expected a CUDA build of torch and a visible GPU (torch.version.cuda=%s)",
            torch.__version__,
            pinned,
            torch.version.cuda,
        )
    else:
        logger.info(
            "torch %s computes on the CPU (%s)",
            torch.__version__,
            f"device {pinned}" if pinned else "no device pinned",
        )
    return TorchPlacement(torch.device("cpu"), settings)


def _set_up_threads() -> None:
    if any(os.environ.get(name) for name in THREAD_ENV_VARS):
        logger.info("torch thread pools left to the environment (%s)", ", ".join(THREAD_ENV_VARS))
        return
    cores = len(os.sched_getaffinity(0))
    intra, inter = max(1, cores - 1), cores
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter)
    except RuntimeError as exc:  # torch already ran inter-op work in this process: too late
        logger.info("torch inter-op thread pool left as it was: %s", exc)
        inter = torch.get_num_interop_threads()
    logger.info("torch thread pools: %d intra-op, %d inter-op thread(s)", intra, inter)
