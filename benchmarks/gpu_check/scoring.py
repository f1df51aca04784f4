"""The executors' checks: rows scored through the node by processes that never touch CUDA, and
the compute-heavy model through the server against the same model inside the executors.

Every run has ``plan.executors`` processes side by side, started together
(``contenders.run_together``): executors of ``benchmarks.gpu_check.executor`` for the server
path, processes of ``benchmarks.gpu_check.in_process`` for the model inside the executor (on the
CPU, each with its share of the cores; on the GPU, each with its own CUDA context, as workers
that load their own model do). The executors keep the machine's environment, GPUs visible: that
they never initialise CUDA is their own doing.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from benchmarks.gpu_check import nvml
from benchmarks.gpu_check.contenders import Reading, Run, cores_each, run_together
from benchmarks.gpu_check.models import HEAVY, MLP, NULL, features_of
from benchmarks.gpu_check.node_check import server_metrics
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.results import FAILED, RECORDED, Report, against, holds, mib, rate, skipped
from benchmarks.processes import metric_value
from udfserve.discovery import NodeDiscovery, ServerEntry
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.executor.rechunk import planned_request_rows

RUN_TIMEOUT_S = 240.0
SERVER_OVER_CPU_TARGET = 1.0
"""On a GPU, the server path must at least match the model inside the executors on the CPU."""


def shares(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` nearly equal counts."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def executor_run(
    plan: Plan, discovery_file: Path, model: str, rows: int, log_dir: Path, sample: Reading | None = None
) -> Run:
    payloads = []
    first_id = 0
    for index, count in enumerate(shares(rows, plan.executors)):
        payloads.append(
            {
                "discovery_file": str(discovery_file),
                "model": model,
                "features": features_of(plan, model),
                "rows": count,
                "first_id": first_id,
                "seed": plan.seed + index,
                "spark_batch_rows": plan.spark_batch_rows,
                "max_in_flight": plan.max_in_flight,
                "partition_id": index,
            }
        )
        first_id += count
    return run_together("benchmarks.gpu_check.executor", payloads, os.environ, log_dir, RUN_TIMEOUT_S, sample)


def in_process_run(
    plan: Plan,
    repository: Path,
    device: str,
    rows_per_call: int,
    log_dir: Path,
    sample: Reading | None = None,
) -> Run:
    budget_s = plan.heavy_cpu_budget_s if device == "cpu" else RUN_TIMEOUT_S / 2
    payloads = [
        {
            "repository": str(repository),
            "model": HEAVY,
            "device": device,
            "features": plan.heavy_features,
            "rows": count,
            "seed": plan.seed + index,
            "rows_per_call": rows_per_call,
            "budget_s": budget_s,
        }
        for index, count in enumerate(shares(plan.heavy_rows, plan.executors))
    ]
    env = {**os.environ, "OMP_NUM_THREADS": cores_each(plan.executors)} if device == "cpu" else os.environ
    return run_together(
        "benchmarks.gpu_check.in_process", payloads, env, log_dir / device, RUN_TIMEOUT_S, sample
    )


def gpu_reading(server: ServerEntry | None) -> Reading:
    """What to sample while a run goes: the server's utilisation gauge, NVML's own reading and
    device memory, and which pids hold a CUDA context (kept in the sample under ``pid:<n>``)."""

    def read() -> dict[str, float]:
        sample: dict[str, float] = {}
        if server is not None:
            sample["gauge"] = metric_value(server_metrics(server), "udfserve_gpu_utilization_ratio")
        utilisation, used = nvml.utilisation_ratio(), nvml.memory_used_bytes()
        if utilisation is not None and used is not None:
            sample["nvml"], sample["memory"] = utilisation, float(used)
        sample.update({f"pid:{pid}": 1.0 for pid in nvml.compute_processes()})
        return sample

    return read


def sampled_pids(run: Run) -> set[int]:
    return {int(key.split(":", 1)[1]) for sample in run.samples for key in sample if key.startswith("pid:")}


def check_executor_run(plan: Plan, model: str, run: Run, before: str, after: str, report: Report) -> None:
    """Every row answered once by the server, through shared memory, by processes free of CUDA."""
    rows_in, rows_out = sum(run.every("rows_in")), run.rows
    in_order = all(run.every("in_order")) and not sum(run.every("nulls"))
    by_fallback = sum(run.every("rows_by_fallback"))
    report.add(
        "executor",
        f"{model}: rows answered once, in order",
        f"{rows_out:,} of {rows_in:,}; {by_fallback} by the CPU fallback",
        holds(rows_out == rows_in and in_order and not by_fallback),
        f"{plan.executors} executors without PySpark, discovery file -> unix socket, fallback='error'",
    )
    requests = metric_value(after, "udfserve_requests_total", model=model) - metric_value(
        before, "udfserve_requests_total", model=model
    )
    # the counter has no model label: only this model is called between the two scrapes
    in_shm = metric_value(after, "udfserve_shared_memory_requests_total") - metric_value(
        before, "udfserve_shared_memory_requests_total"
    )
    sends, sends_in_shm = sum(run.every("sends")), sum(run.every("sends_in_shared_memory"))
    report.add(
        "executor",
        f"{model}: requests through shared memory",
        f"{in_shm:,.0f} of {requests:,.0f}",
        holds(requests > 0 and in_shm == requests and sends_in_shm == sends == requests),
        f"the server's udfserve_shared_memory_requests_total; the clients' count: {sends_in_shm:,} of "
        f"{sends:,} sends",
    )
    imported = sorted({name for names in run.every("imported") for name in names})
    mapped = sorted({name for names in run.every("cuda_libraries") for name in names})
    on_gpu = sorted(sampled_pids(run) & set(run.every("pid")))
    report.add(
        "executor",
        f"{model}: executors never initialise CUDA (nor load pandas)",
        f"imported {imported or 'no torch, TensorFlow or pandas'}; CUDA libraries mapped: {mapped or 'none'}",
        holds(not mapped and not imported and not on_gpu),
        "each executor's /proc/self/maps at its end; NVML's compute processes sampled while they ran"
        + (f": executor pids on the GPU {on_gpu}" if on_gpu else ""),
    )
    report.add(
        "executor",
        f"{model}: rows/s through the node",
        rate(rows_out, run.seconds),
        RECORDED,
        f"{rows_out:,} rows in {run.seconds:.2f} s, Spark batches of {plan.spark_batch_rows:,} rows"
        + (" (the null model: the serving path's ceiling on this host)" if model == NULL else ""),
    )


def check_scoring(
    plan: Plan,
    repository: Path,
    discovery_file: Path,
    discovery: NodeDiscovery,
    idle_memory: int | None,
    work: Path,
    report: Report,
) -> None:
    """The executors' runs against the node's server; ``idle_memory`` is the device memory in use
    before the node started (None without NVML)."""
    server = discovery.servers[0]
    for model, rows in ((MLP, plan.rows), (NULL, plan.rows)):
        before = server_metrics(server)
        run = executor_run(plan, discovery_file, model, rows, work / model, gpu_reading(None))
        check_executor_run(plan, model, run, before, server_metrics(server), report)
    _check_heavy(plan, repository, discovery_file, server, idle_memory, work, report)


def _check_heavy(
    plan: Plan,
    repository: Path,
    discovery_file: Path,
    server: ServerEntry,
    idle_memory: int | None,
    work: Path,
    report: Report,
) -> None:
    gpu = plan.device == "gpu"
    before = server_metrics(server)
    served = executor_run(
        plan, discovery_file, HEAVY, plan.heavy_rows, work / HEAVY, gpu_reading(server if gpu else None)
    )
    check_executor_run(plan, HEAVY, served, before, server_metrics(server), report)
    # the CPU fallback answers each of the client's requests; a worker holding the model on a GPU
    # would call it with as many rows as the model takes
    client = ClientConfig()
    request_rows = planned_request_rows(
        client.rows_per_request, client.bytes_per_request, 4 * plan.heavy_features, plan.heavy_max_batch_size
    )
    cpu = in_process_run(plan, repository, "cpu", request_rows, work / "in-process")
    report.add(
        "heavy",
        f"{HEAVY} in-process on the CPU",
        rate(cpu.rows, cpu.seconds),
        RECORDED if set(cpu.every("computed_on")) == {"cpu"} else FAILED,
        f"{plan.executors} processes x {cores_each(plan.executors)} threads, {cpu.rows:,} rows in "
        f"{cpu.seconds:.1f} s, {request_rows:,} a call; the CPU fallback's code path",
    )
    ratio = served.rows_s / cpu.rows_s if cpu.rows_s else 0.0
    report.add(
        "heavy",
        f"{'the GPU server' if gpu else 'the server'} / in-process CPU",
        f"{ratio:.2f}x",
        against(ratio, SERVER_OVER_CPU_TARGET) if gpu else RECORDED,
        f"target at least {SERVER_OVER_CPU_TARGET:.1f}x on a GPU"
        if gpu
        else "the dry run's server is on the CPU too",
    )
    if not gpu:
        report.add("heavy", f"{HEAVY} in-process on the GPU", "-", skipped("needs an NVIDIA GPU"))
        report.add("heavy", "GPU utilisation while one server computes", "-", skipped("needs an NVIDIA GPU"))
        return
    before_inside = nvml.memory_used_bytes()
    inside = in_process_run(
        plan, repository, "gpu:0", plan.heavy_max_batch_size, work / "in-process", gpu_reading(None)
    )
    places = sorted(set(inside.every("computed_on")))
    report.add(
        "heavy",
        f"{HEAVY} in-process on the GPU",
        rate(inside.rows, inside.seconds),
        holds(places == ["cuda:0"]),
        f"{plan.executors} processes, each its own CUDA context, computing on {places}; "
        f"{inside.rows:,} rows, {plan.heavy_max_batch_size:,} a call",
    )
    report.add(
        "heavy",
        "the GPU server / in-process GPU",
        f"{served.rows_s / inside.rows_s:.2f}x" if inside.rows_s else "n/a",
        RECORDED,
        "same rows and processes; the server adds the Arrow transport, merges their requests",
    )
    memory_served, memory_inside = served.sampled("memory"), inside.sampled("memory")
    if memory_served and memory_inside and idle_memory is not None and before_inside is not None:
        report.add(
            "heavy",
            "device memory: the server / the in-process workers",
            f"{mib(max(memory_served) - idle_memory)} / {mib(max(memory_inside) - before_inside)}",
            RECORDED,
            f"NVML's used memory at each run's peak, less what was in use before: one server process "
            f"against {plan.executors} workers, each with its CUDA context and its copy of the model",
        )
    _report_utilisation(plan, served, report)


def _report_utilisation(plan: Plan, served: Run, report: Report) -> None:
    gauge, own = served.sampled("gauge"), served.sampled("nvml")
    if not gauge:
        report.add(
            "heavy",
            "GPU utilisation while one server computes",
            "no samples",
            FAILED,
            "the server's udfserve_gpu_utilization_ratio, read every 0.25 s",
        )
        return
    report.add(
        "heavy",
        "GPU utilisation while one server computes",
        f"mean {statistics.fmean(gauge):.2f}, peak {max(gauge):.2f} ({len(gauge)} samples)",
        RECORDED,
        f"the server's udfserve_gpu_utilization_ratio (NVML read here: mean "
        f"{statistics.fmean(own) if own else 0:.2f}). "
        "Two servers on one GPU are not a setting: the node runs one per device; headroom here is what "
        "--inference-threads 2 (host and device work of two calls overlapped) can use",
    )
