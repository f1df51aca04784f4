"""How the ONNX Runtime backend builds a session: threads, graph optimisation, execution providers.

One model server runs per device and shares the node's cores with Spark's executors, so a
session must neither take every core nor keep idle cores busy:

- intra-op threads: one core short of the process's (as TensorFlow's pool, ``tensorflow.
  _set_up_threads``). ONNX Runtime counts the calling thread as one of them, so on 2 cores a
  call runs in its caller's thread alone; the server's ``cpu_parallel`` cuts large calls into
  concurrent calls, each in its own thread, which a session runs at once.
- sequential execution (the graph's nodes one after another; inter-op pool of one): the
  examples are chains of ops, and concurrent calls are the server's way to use several cores.
- no spinning: ONNX Runtime's pool threads otherwise busy-wait after each call, and a server
  between small batches burnt a core that Spark needs (measured: docs/backends.md).
- graph optimisation level ALL (constant folding, fusions), once at load.
- the CPU arena shrunk after each call (``run_options``): ONNX Runtime otherwise keeps the peak of
  any one call in its arena for the life of the session (a call of 1 GB of intermediates left
  the process 1 GB larger for good). The CUDA arena is not shrunk (a ``cudaFree`` and
  ``cudaMalloc`` per call); ``gpu_mem_limit_bytes`` bounds it instead.

Devices: a process pinned to ``gpu:N`` (``device.pin_device``, which leaves that GPU as CUDA
device 0) runs on the CUDA execution provider with device_id 0, its memory arena growing by what
each call asks for (``kSameAsRequested``, as TensorFlow's memory growth) up to
``gpu_mem_limit_bytes``; where ONNX Runtime has no CUDA provider (the CPU wheel, or no CUDA
libraries), the CPU provider with one WARNING line saying why. Any other process (``cpu``,
``sim:N``, the Spark CPU fallback, a script) runs on the CPU provider. Custom-op libraries are
never registered: a graph runs ONNX Runtime's own operators only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import onnxruntime as ort
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from udfserve.runtime import device

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
SESSION_LOG_FATAL_ONLY = 4
"""ONNX Runtime's own log of a session: fatal lines only. It prints an error of a call (an id
out of range) to stderr in colour before raising it; the backend raises it to the request, with
the same words, so the stderr line is noise in a server log."""


class OnnxRuntimeSettings(BaseSettings):
    """Settings of ONNX Runtime sessions, from ``UDFSERVE_ONNXRUNTIME_<FIELD>`` variables; read once
    when the backend is first used in a process (a server, or a Spark worker's CPU fallback)."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_ONNXRUNTIME_", extra="ignore", frozen=True)

    intra_op_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="threads of one call, the calling thread included; 0: one short of the process's cores",
    )
    shrink_cpu_arena: bool = Field(
        default=True,
        description="after each call, give the memory of the CPU arena that the call no longer uses "
        "back (a call that needed 1 GB otherwise keeps it in the arena for the life of the session); "
        "measured within noise of not shrinking for calls of 64 to 8,192 rows (docs/backends.md)",
    )
    gpu_mem_limit_bytes: int = Field(
        default=0,
        ge=0,
        description="on a GPU: the most memory the CUDA provider's arena of one model takes; 0: no limit "
        "but the device's own",
    )


def read_settings() -> OnnxRuntimeSettings:
    """The settings from the environment; ``ValueError`` naming each variable that is invalid, its
    value and what was expected."""
    try:
        return OnnxRuntimeSettings()
    except ValidationError as exc:
        prefix = OnnxRuntimeSettings.model_config.get("env_prefix", "")
        problems = "; ".join(
            f"{prefix}{'_'.join(str(part) for part in error['loc']).upper()}={error.get('input')!r}: "
            f"{error['msg']}"
            for error in exc.errors()
        )
        raise ValueError(f"invalid onnxruntime setting(s): {problems}") from None


def intra_op_threads(settings: OnnxRuntimeSettings) -> int:
    """The setting, or one core short of the cores this process may run on (at least one)."""
    if settings.intra_op_threads:
        return settings.intra_op_threads
    return max(1, len(os.sched_getaffinity(0)) - 1)


def session_options(settings: OnnxRuntimeSettings) -> ort.SessionOptions:
    """Options of every session the backend opens (module docstring: why these)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads(settings)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = SESSION_LOG_FATAL_ONLY
    return options


def run_options(settings: OnnxRuntimeSettings) -> ort.RunOptions:
    """The options of one call (a few hundred nanoseconds to make): its own, so the server can stop
    that call alone (``terminate``)."""
    options = ort.RunOptions()
    options.log_severity_level = SESSION_LOG_FATAL_ONLY
    if settings.shrink_cpu_arena:
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def wants_gpu() -> bool:
    """Whether this process is pinned to a GPU (``gpu:N``)."""
    pinned = device.pinned_device()
    return pinned is not None and pinned.startswith("gpu:")


def providers(settings: OnnxRuntimeSettings, available: list[str]) -> list[Any]:
    """The execution providers a session is opened with, best first.

    On a GPU-pinned process whose ONNX Runtime has the CUDA provider: CUDA on device 0 (the one
    GPU ``pin_device`` left visible), then the CPU for the ops CUDA lacks. Otherwise the CPU.
    """
    if not wants_gpu() or CUDA_PROVIDER not in available:
        return [CPU_PROVIDER]
    options: dict[str, str] = {"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}
    if settings.gpu_mem_limit_bytes:
        options["gpu_mem_limit"] = str(settings.gpu_mem_limit_bytes)
    return [(CUDA_PROVIDER, options), CPU_PROVIDER]


def check_device(session_providers: list[str], available: list[str], what: str) -> None:
    """One WARNING when a GPU-pinned process computes ``what`` on the CPU, saying why."""
    if not wants_gpu() or CUDA_PROVIDER in session_providers:
        return
    if CUDA_PROVIDER not in available:
        why = (
            f"this onnxruntime {ort.__version__} has no CUDA execution provider (available: "
            f"{', '.join(available)}); expected the onnxruntime-gpu package for a GPU"
        )
    else:
        why = "the CUDA execution provider could not start (its libraries or the device are missing)"
    logger.warning(
        "%s runs on the CPU although this process is pinned to %s: %s",
        what,
        device.pinned_device(),
        why,
    )


def announce(settings: OnnxRuntimeSettings, available: list[str]) -> None:
    """The one line that says how this process's sessions compute."""
    logger.info(
        "onnxruntime %s: %d intra-op thread(s), no spinning, providers %s (available: %s)",
        ort.__version__,
        intra_op_threads(settings),
        [p if isinstance(p, str) else p[0] for p in providers(settings, available)],
        ", ".join(available),
    )
