"""One executor of the GPU check: a process that scores rows through the node as a Spark Python
worker of ``predict_arrow`` does, and that must never initialise CUDA.

    python -m benchmarks.gpu_check.executor '<payload as JSON>'

PySpark is made unimportable first (the GPU machine has none, and the client's partition path
must not need it). The process makes its rows, describes the model through the node's discovery
file, prints ``{"ready": true}``, waits for a line on its standard input (so that every executor
of a run starts scoring at once), scores, and prints what it did as one JSON line: rows in and
out, whether every row came back once and in order, its time, and what it imported or mapped
(torch, TensorFlow, a CUDA library: each must be absent).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

CUDA_LIBRARIES = ("libcuda.so", "libcudart", "libcublas", "libcudnn")
"""Shared objects whose presence in a process's mappings means CUDA was loaded into it."""


def cuda_libraries_mapped(pid: int | str = "self") -> list[str]:
    """The CUDA libraries in a process's memory map (Linux ``/proc/<pid>/maps``)."""
    found: set[str] = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        name = line.rsplit("/", 1)[-1] if "/" in line else ""
        found.update(library for library in CUDA_LIBRARIES if name.startswith(library))
    return sorted(found)


def run(payload: dict[str, Any]) -> dict[str, Any]:
    """Make the rows, wait for the start line, score them; what happened."""
    import numpy as np

    from benchmarks.gpu_check.client import ID_COLUMN, int64_values, job_for, score, spark_batches
    from benchmarks.gpu_check.models import INPUT, OUTPUTS, rows_of
    from udfserve.spark_client.common.config import ClientConfig
    from udfserve.spark_client.observability.stats import ClientStats

    model = payload["model"]
    output = OUTPUTS[model]
    values = rows_of(payload["rows"], payload["features"], payload["seed"])
    batches = spark_batches(values, payload["first_id"], payload["spark_batch_rows"], INPUT)
    config = ClientConfig(
        discovery_file=payload.get("discovery_file"),
        address=payload.get("address"),
        fallback="error",  # a row the server did not answer fails the run instead of computing here
        max_in_flight=payload["max_in_flight"],
    )
    job = job_for(model, config)
    print(json.dumps({"ready": True, "rows_per_request": job.config.rows_per_request}), flush=True)
    sys.stdin.readline()

    stats = ClientStats()
    started_at = time.time()
    started = time.perf_counter()
    rows_out = nulls = 0
    in_order = True
    next_id = payload["first_id"]
    for answered in score(job, batches, (INPUT,), (output,), stats, payload["partition_id"]):
        ids = int64_values(answered.column(ID_COLUMN))
        in_order &= bool(np.array_equal(ids, np.arange(next_id, next_id + len(ids))))
        next_id += len(ids)
        rows_out += answered.num_rows
        nulls += answered.column(output).null_count
    seconds = time.perf_counter() - started
    return {
        "pid": os.getpid(),
        "rows_in": payload["rows"],
        "rows_out": rows_out,
        "in_order": in_order,
        "nulls": nulls,
        "seconds": seconds,
        "started_at": started_at,
        "ended_at": started_at + seconds,
        "rows_by_server": stats.rows_by_server,
        "rows_by_fallback": stats.rows_by_fallback,
        "retries": stats.retries,
        "sends": stats.sends,
        "sends_in_shared_memory": stats.sends_in_shared_memory,
        "server_failures": stats.server_failures,
        "imported": sorted(name for name in ("torch", "tensorflow", "pandas") if name in sys.modules),
        "cuda_libraries": cuda_libraries_mapped(),
    }


def main(argv: list[str]) -> int:
    sys.modules["pyspark"] = None  # type: ignore[assignment]  # as on a machine without PySpark
    print(json.dumps(run(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
