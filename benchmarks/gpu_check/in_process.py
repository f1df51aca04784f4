"""The in-process contender of the GPU check: the model loaded inside the executor process.

    python -m benchmarks.gpu_check.in_process '<payload as JSON>'

This is what udfserve replaces: each Spark Python worker loading its own copy of the model, on
the CPU or on the one GPU every worker of the node then shares. It runs the same code as the
client's CPU fallback (``spark_client/executor/fallback.py``, ``predict_on_cpu``): the process pinned to
its device before the framework loads (``udfserve.runtime.device.pin_device``), the model loaded
by the runtime the servers run, each request converted from Arrow and back as a server converts
it. The payload's ``device`` is ``cpu`` or ``gpu:0``.

Protocol as ``benchmarks.gpu_check.executor``: ``{"ready": true}``, a line on standard input, then
one JSON line. A run stops at its rows or once ``budget_s`` has passed, whichever comes first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def run(payload: dict[str, Any]) -> dict[str, Any]:
    """Load the model on the payload's device, make the rows, wait for the start line, predict."""
    from udfserve.runtime.device import pin_device

    pin_device(payload["device"])  # before torch is imported, as the fallback hides the GPUs first

    import pyarrow as pa

    from benchmarks.gpu_check.client import list_array
    from benchmarks.gpu_check.executor import cuda_libraries_mapped
    from benchmarks.gpu_check.models import INPUT, rows_of
    from udfserve.runtime.repository import load_model, model_source
    from udfserve.runtime.tensor_conversion import batch_to_inputs, outputs_to_batch

    loaded = load_model(model_source(Path(payload["repository"]), payload["model"]))
    values = rows_of(payload["rows"], payload["features"], payload["seed"])
    step = payload["rows_per_call"]
    requests = [
        pa.RecordBatch.from_arrays([list_array(values[start : start + step])], names=[INPUT])
        for start in range(0, len(values), step)
    ]
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()

    started_at = time.time()
    started = time.perf_counter()
    deadline = started + payload["budget_s"]
    rows = 0
    for request in requests:
        answer = outputs_to_batch(
            loaded.predict(batch_to_inputs(request, loaded.name, loaded.inputs)), loaded.outputs
        )
        rows += answer.num_rows
        if time.perf_counter() > deadline:
            break
    seconds = time.perf_counter() - started
    return {
        "pid": os.getpid(),
        "rows_in": rows,
        "rows_out": rows,
        "seconds": seconds,
        "started_at": started_at,
        "ended_at": started_at + seconds,
        "computed_on": computed_on(),
        "cuda_libraries": cuda_libraries_mapped(),
    }


def computed_on() -> str:
    """Where this process computed: ``cuda:N`` once torch initialised CUDA in it, else ``cpu``."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"


def main(argv: list[str]) -> int:
    print(json.dumps(run(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
