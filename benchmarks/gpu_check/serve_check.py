"""The check of ``udfserve serve --device gpu:0``: a ``torch.export`` model and an ONNX model
served from the device, pinned by the server itself.

The server is started with ``CUDA_VISIBLE_DEVICES=""`` in its environment, which hides every
GPU: a server that then computes on ``cuda:0`` has set the variable itself before its framework
loaded (``udfserve.runtime.device.pin_device``), as it must on a node where the supervisor's
environment exposes every GPU. Where each model computes is read from the server's own log lines
(``--log-format json``): the PyTorch backend's "computes on" line and ONNX Runtime's providers.
Both models answer the serve check's reference rows as the CPU does, within float32 tolerance (TF32
on the GPU: cuDNN's convolutions and ONNX Runtime's CUDA matrix products use it by default).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from benchmarks.gpu_check import nvml
from benchmarks.gpu_check.client import job_for, output_matrix, score, spark_batches
from benchmarks.gpu_check.models import HEAVY, INPUT, MLP, OUTPUTS, read_references
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.results import FAILED, OK, RECORDED, Report, holds, mib, skipped
from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.observability.stats import ClientStats

TORCH_PLACEMENT = re.compile(r"^torch \S+ computes on (?P<where>cuda:0|the CPU) \((?P<what>[^)]*)")
TORCH_NO_CUDA = re.compile(r"^torch \S+ sees no CUDA device although")
ORT_PROVIDERS = re.compile(
    r"^onnxruntime \S+: .* providers (?P<providers>\[[^]]*\]) \(available: (?P<available>[^)]*)\)"
)
ORT_ON_CPU = re.compile(r"^.* runs on the CPU although this process is pinned to \S+: (?P<why>.*)")
"""ONNX Runtime's one WARNING when a session of a GPU-pinned process computes on the CPU anyway."""
TOLERANCE = {"gpu": 2e-3, "cpu": 1e-5}
"""Largest difference from the CPU's answers allowed: TF32 on the GPU, float32 rounding on the CPU."""
SERVER_ARGS = ("--log-level", "INFO", "--log-format", "json")


@contextlib.contextmanager
def started_server(
    plan: Plan, repository: Path, work: Path, name: str, models: Sequence[str], env: Mapping[str, str]
) -> Iterator[ServerProcess]:
    """``udfserve serve`` of ``models`` on the plan's device, logging JSON to ``<work>/<name>.log``;
    stopped after. Its lifeline (``--lifeline-fd``) is a pipe this process holds: a check killed
    past the time limit leaves no server holding the GPU."""
    log_path = work / f"{name}.log"
    log_path.unlink(missing_ok=True)
    read_end, write_end = os.pipe()  # neither end is inherited but the one passed
    try:
        server = launch_server(
            repository,
            device=plan.server_device,
            socket=work / f"{name}.sock",
            extra_args=[*SERVER_ARGS, "--models", ",".join(models)],
            env=env,
            log_path=log_path,
            ready_timeout_s=240,
            lifeline_fd=read_end,
        )
        try:
            yield server
        finally:
            server.terminate()
    finally:
        os.close(read_end)
        os.close(write_end)


def log_messages(path: Path) -> list[str]:
    """The ``message`` of every JSON line of a server's log (other lines left out)."""
    messages = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            messages.append(record["message"])
    return messages


def first_match(messages: list[str], pattern: re.Pattern[str]) -> re.Match[str] | None:
    return next((m for m in map(pattern.match, messages) if m), None)


def answers_of(target: str, model: str, values: np.ndarray) -> np.ndarray:
    """``model``'s answers to ``values`` from the server at ``target``, through the client."""
    job = job_for(model, ClientConfig(address=target, fallback="error"))
    batches = spark_batches(values, 0, len(values), INPUT)
    return output_matrix(
        list(score(job, batches, (INPUT,), (OUTPUTS[model],), ClientStats())), OUTPUTS[model]
    )


def check_serve(plan: Plan, repository: Path, work: Path, report: Report) -> None:
    """Start the server on the plan's device with every GPU hidden; report where its models run."""
    before = nvml.memory_used_bytes()
    started = time.perf_counter()
    every_gpu_hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    with started_server(plan, repository, work, "serve", (HEAVY, MLP), every_gpu_hidden) as server:
        ready_s = time.perf_counter() - started
        report.add(
            "serve",
            f"`udfserve serve --device {plan.server_device}` ready",
            f"{ready_s:.1f} s",
            RECORDED,
            "spawn to SERVING, both models loaded and warmed up",
        )
        _report_placement(plan, server, report)
        _report_answers(plan, repository, server, report)
        _report_memory(plan, server, before, report)


def _report_placement(plan: Plan, server: ServerProcess, report: Report) -> None:
    assert server.log_path is not None
    messages = log_messages(server.log_path)
    torch_line = first_match(messages, TORCH_PLACEMENT)
    if torch_line:
        where, figure = torch_line["where"], f"{torch_line['where']} ({torch_line['what']})"
    else:
        where = figure = (
            "the CPU: torch sees no CUDA device" if first_match(messages, TORCH_NO_CUDA) else "no line"
        )
    expected = "cuda:0" if plan.device == "gpu" else "the CPU"
    report.add(
        "serve",
        f"{HEAVY} (torch.export) computes on",
        figure,
        holds(where == expected),
        'started with CUDA_VISIBLE_DEVICES="" in its environment: the server pinned '
        f"{plan.server_device} itself (expected {expected}); the PyTorch backend's log line",
    )
    ort_line = first_match(messages, ORT_PROVIDERS)
    if ort_line is None:
        report.add("serve", f"{MLP} (ONNX) execution provider", "no providers line in the log", FAILED)
        return
    providers, available = ort_line["providers"], ort_line["available"]
    on_cpu = first_match(messages, ORT_ON_CPU)
    if plan.device == "cpu":
        verdict, why = holds("CPUExecutionProvider" in providers), "a CPU server opens the CPU provider"
    elif on_cpu is None and "CUDAExecutionProvider" in providers:
        verdict, why = OK, "ONNX Runtime's CUDA provider on device 0"
    elif "CUDAExecutionProvider" not in available:
        verdict = RECORDED
        why = "this machine's onnxruntime has no CUDA provider (the CPU wheel): the model ran on the CPU"
    else:
        verdict = FAILED
        why = f"the model ran on the CPU: {on_cpu['why'] if on_cpu else 'the CUDA provider was not opened'}"
    report.add(
        "serve", f"{MLP} (ONNX) execution provider", providers, verdict, f"{why}; available: {available}"
    )


def _report_answers(plan: Plan, repository: Path, server: ServerProcess, report: Report) -> None:
    references = read_references(repository)
    target = server.grpc_target()
    for model in (HEAVY, MLP):
        expected = references[f"{model}/output"]
        received = answers_of(target, model, references[f"{model}/input"])
        difference = (
            float(np.max(np.abs(received - expected))) if received.shape == expected.shape else float("inf")
        )
        report.add(
            "serve",
            f"{model}: answers equal the CPU's",
            f"max abs difference {difference:.2e} over {len(expected)} rows",
            holds(difference <= TOLERANCE[plan.device]),
            f"through the Spark client over the unix socket; tolerance {TOLERANCE[plan.device]:.0e}",
        )


def _report_memory(plan: Plan, server: ServerProcess, before: int | None, report: Report) -> None:
    if plan.device != "gpu":
        report.add("serve", "device memory the server holds (NVML)", "-", skipped("needs an NVIDIA GPU"))
        return
    after = nvml.memory_used_bytes()
    held = (after or 0) - (before or 0)
    processes = nvml.compute_processes()
    listed = server.pid in processes
    report.add(
        "serve",
        "device memory the server holds (NVML)",
        mib(held),
        holds(held > 0),
        f"used memory after start minus before; the server's pid {'is' if listed else 'is not'} among "
        f"NVML's compute processes ({len(processes)} listed"
        + ("" if listed else "; in a container NVML reports the host's pids")
        + ")",
    )
