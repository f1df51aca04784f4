"""The check of a real out-of-memory: a batch too big for a memory cap is split, every row answered once.

``wide_oom`` holds two float32 vectors of ``oom_width`` per row while it runs, so one request of
``oom_request_rows`` rows needs several times ``oom_cap_bytes``. On a GPU the cap is the PyTorch
backend's own (``UDFSERVE_TORCH_CUDA_MEMORY_FRACTION``, the share of the device that
``oom_cap_bytes`` is): the CUDA caching allocator raises ``torch.OutOfMemoryError``. On the CPU the
cap is the server's address space, limited once it has loaded to what it maps plus
``oom_cap_bytes`` (``RLIMIT_AS``, set on the running server): torch's CPU allocator fails with
"can't allocate memory". Either way the backend reports ``DeviceOutOfMemory`` and the batcher
splits the call in halves until the pieces fit (``core/batching/recovery.py``).

The same rows are first sent in small requests, which fit; the big request's answers must equal
theirs row for row, and the server's metrics must show the out-of-memory calls and splits.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import numpy as np
import psutil

from benchmarks.gpu_check import nvml
from benchmarks.gpu_check.client import ID_COLUMN, job_for, output_matrix, score, spark_batches
from benchmarks.gpu_check.models import INPUT, OOM, OOM_FEATURES, OUTPUTS, rows_of
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.results import Report, holds, mib
from benchmarks.gpu_check.serve_check import started_server
from benchmarks.processes import metric_value, scrape
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.observability.stats import ClientStats

SMALL_REQUEST_ROWS = 1024


def cap_environment(plan: Plan) -> tuple[dict[str, str], str]:
    """The server's environment, with the CUDA cap on a GPU; and the cap in words."""
    env = dict(os.environ)
    if plan.device != "gpu":
        return env, f"address space of the loaded server + {mib(plan.oom_cap_bytes)} (RLIMIT_AS)"
    total = nvml.detection().gpus[0].memory_total_bytes
    fraction = plan.oom_cap_bytes / total
    env["UDFSERVE_TORCH_CUDA_MEMORY_FRACTION"] = f"{fraction:.6f}"
    return env, f"CUDA allocator cap {mib(plan.oom_cap_bytes)} ({fraction:.4f} of {mib(total)})"


def limit_address_space(server: ServerProcess, extra_bytes: int) -> int:
    """Cap the running server's address space at what it maps now plus ``extra_bytes``."""
    limit = psutil.Process(server.pid).memory_info().vms + extra_bytes
    resource.prlimit(server.pid, resource.RLIMIT_AS, (limit, limit))
    return limit


def answers(target: str, values: np.ndarray, rows_per_request: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The answers to ``values`` sent in requests of ``rows_per_request`` rows; their ids, and the
    rows the client got back."""
    config = ClientConfig(
        address=target,
        fallback="error",
        rows_per_request=rows_per_request,
        bytes_per_request=1 << 30,
        max_in_flight=1,
        request_timeout_s=300,
    )
    job = job_for(OOM, config)
    answered = list(
        score(job, spark_batches(values, 0, len(values), INPUT), (INPUT,), (OUTPUTS[OOM],), ClientStats())
    )
    ids = np.concatenate([batch.column(ID_COLUMN).to_numpy() for batch in answered])
    return output_matrix(answered, OUTPUTS[OOM]), ids, sum(batch.num_rows for batch in answered)


def check_oom(plan: Plan, repository: Path, work: Path, report: Report) -> None:
    env, cap = cap_environment(plan)
    with started_server(plan, repository, work, "oom", (OOM,), env) as server:
        values = rows_of(plan.oom_request_rows, OOM_FEATURES, plan.seed + 1)
        # small requests first: they fit, and on the CPU they start every thread the server's calls
        # use (each with its stacks and its allocator arena) before the address space is capped
        small, _, _ = answers(server.grpc_target(), values, SMALL_REQUEST_ROWS)
        if plan.device != "gpu":
            limit_address_space(server, plan.oom_cap_bytes)
        big, ids, rows = answers(server.grpc_target(), values, plan.oom_request_rows)
        metrics = scrape(server)
    ooms = metric_value(metrics, "udfserve_backend_oom_total", model=OOM)
    splits = metric_value(metrics, "udfserve_oom_splits_total", model=OOM)
    limit = metric_value(metrics, "udfserve_batch_limit_rows", model=OOM)
    report.add(
        "oom",
        f"one request of {plan.oom_request_rows:,} rows under a cap",
        f"{ooms:.0f} calls out of memory, {splits:.0f} splits, batch limit now {limit:,.0f} rows",
        holds(ooms >= 1 and splits >= 1),
        f"{cap}; {OOM} needs {mib(2 * 4 * plan.oom_width * plan.oom_request_rows)} for the whole batch; "
        "the server's log: logs/oom.log",
    )
    in_order = bool(np.array_equal(ids, np.arange(plan.oom_request_rows)))
    same = big.shape == small.shape and bool(np.allclose(big, small, rtol=1e-4, atol=1e-5))
    difference = float(np.max(np.abs(big - small))) if big.shape == small.shape else float("inf")
    report.add(
        "oom",
        "every row answered once, as small requests answer it",
        f"{rows:,} of {plan.oom_request_rows:,} rows, in order; max abs difference {difference:.1e}",
        holds(rows == plan.oom_request_rows and in_order and same),
        f"the same rows again in requests of {SMALL_REQUEST_ROWS:,} rows, which fit",
    )
