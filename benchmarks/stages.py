"""Where a request's time goes, stage by stage, with the server's own functions in one process.

The sampled profiles (py-spy) show where a loaded server spends its CPU, but on a shared 2-core
machine their shares blur. This times each stage of the request path alone, on the same batch,
with nothing else running in the process: the client's encoding and protobuf serialisation, the
server's parsing, decoding, schema conversion, backend call, output conversion and encoding,
and the client's decoding of the answer. What the stages do not add up to, in a measured request,
is gRPC itself (HTTP/2 framing, the socket, the event loops).

Run in a child process, since it imports TensorFlow:

    python -m benchmarks.stages --repository DIR --model NAME --rows 16384 [--rows 8 ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.processes import child_env
from benchmarks.report import Table

STAGES = (
    ("client", "encode_batch (request)"),
    ("client", "PredictRequest serialise"),
    ("server", "PredictRequest parse + .arrow_ipc"),
    ("server", "decode_batch"),
    ("server", "batch_to_inputs"),
    ("server", "model.predict"),
    ("server", "outputs_to_batch"),
    ("server", "encode_batch (answer)"),
    ("server", "PredictResponse serialise"),
    ("client", "PredictResponse parse + decode_batch"),
)


def _time_us(operation: Callable[[], object], min_s: float) -> float:
    operation()
    count, started = 0, time.perf_counter()
    while True:
        operation()
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_s and count >= 5:
            return elapsed / count * 1e6


def _request_batch(inputs: Sequence[Any], rows: int, seed: int) -> pa.RecordBatch:
    """Flat ``list<...>`` columns of the model's inputs, as Spark sends ``array<...>``."""
    rng = np.random.default_rng(seed)
    columns = {}
    for spec in inputs:
        per_row = int(np.prod([d if d > 0 else 1 for d in spec.shape])) if spec.shape else 1
        if np.dtype(spec.dtype).kind == "f":
            values = rng.standard_normal(rows * per_row).astype(spec.dtype)
        else:
            values = rng.integers(0, 8, rows * per_row).astype(spec.dtype)
        if not spec.shape:
            columns[spec.name] = pa.array(values)
        else:
            offsets = np.arange(0, rows * per_row + 1, per_row, dtype=np.int32)
            columns[spec.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.record_batch(columns)


def measure_stages(
    repository: Path, model_name: str, rows_list: Sequence[int], min_s: float
) -> dict[str, Any]:
    from udfserve.runtime.device import pin_device

    pin_device("cpu")
    from udfserve.runtime.repository import load_model, scan_repository

    source = next(s for s in scan_repository(repository, [model_name]).sources)
    model = load_model(source)
    return {
        "model": model_name,
        "rows": {str(rows): _time_stages(model, model_name, rows, min_s) for rows in rows_list},
    }


def _time_stages(model: Any, model_name: str, rows: int, min_s: float) -> dict[str, Any]:
    from udfserve.protocol import inference_pb2 as pb
    from udfserve.protocol.arrow_ipc import decode_batch, encode_batch
    from udfserve.runtime.tensor_conversion import batch_to_inputs, outputs_to_batch

    batch = _request_batch(model.inputs, rows, seed=rows)
    payload = encode_batch(batch)
    request_bytes = pb.PredictRequest(model=model_name, batch_id=1, arrow_ipc=payload).SerializeToString()
    decoded = decode_batch(payload)
    inputs = batch_to_inputs(decoded, model_name, model.inputs)
    outputs = model.predict(inputs)
    answer_batch = outputs_to_batch(outputs, model.outputs)
    answer = encode_batch(answer_batch)
    response_bytes = pb.PredictResponse(batch_id=1, arrow_ipc=answer, model_version=1).SerializeToString()
    operations: list[Callable[[], object]] = [
        lambda: encode_batch(batch),
        lambda: pb.PredictRequest(model=model_name, batch_id=1, arrow_ipc=payload).SerializeToString(),
        lambda: pb.PredictRequest.FromString(request_bytes).arrow_ipc,
        lambda: decode_batch(payload),
        lambda: batch_to_inputs(decoded, model_name, model.inputs),
        lambda: model.predict(inputs),
        lambda: outputs_to_batch(outputs, model.outputs),
        lambda: encode_batch(answer_batch),
        lambda: pb.PredictResponse(batch_id=1, arrow_ipc=answer, model_version=1).SerializeToString(),
        lambda: decode_batch(pb.PredictResponse.FromString(response_bytes).arrow_ipc),
    ]
    timings = [_time_us(operation, min_s) for operation in operations]
    return {
        "request_bytes": len(payload),
        "answer_bytes": len(answer),
        "stages_us": {f"{side}: {name}": us for (side, name), us in zip(STAGES, timings, strict=True)},
        "alternatives_us": {CUT_STAGE: _time_cut_predict(model, inputs, min_s)},
    }


CUT_STAGE = "server: model.predict cut into one part per core (--cpu-parallel-min-rows 256)"
"""Timed besides the stages, not summed with them: a CPU server can run large calls cut by rows
into concurrent parts (``udfserve.services.model_server.core.cpu_parallel``, off by default)."""


def _time_cut_predict(model: Any, inputs: dict[str, np.ndarray], min_s: float) -> float:
    import concurrent.futures
    import os

    from udfserve.services.model_server.core.cpu_parallel import (
        SUGGESTED_MIN_ROWS_PER_PART,
        CoreParallelPredict,
    )

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return _time_us(lambda: model.predict(inputs), min_s)
    min_rows = SUGGESTED_MIN_ROWS_PER_PART
    with concurrent.futures.ThreadPoolExecutor(max_workers=cores - 1) as executor:
        cut = CoreParallelPredict(model.predict, parts=cores, min_rows_per_part=min_rows, executor=executor)
        return _time_us(lambda: cut(inputs), min_s)


def stages_in_child(repository: Path, model: str, rows: Sequence[int], min_s: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.stages", "--repository", str(repository), "--model", model]
    command += [arg for r in rows for arg in ("--rows", str(r))] + ["--min-s", str(min_s)]
    completed = subprocess.run(command, capture_output=True, text=True, env=child_env(), check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"timing the stages of {model!r} failed with exit code {completed.returncode}: "
            f"{completed.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time each stage of the request path alone.")
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, action="append", required=True)
    parser.add_argument("--min-s", type=float, default=0.5, help="time spent on each stage")
    args = parser.parse_args(argv)
    print(json.dumps(measure_stages(args.repository, args.model, args.rows, args.min_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def stages_table(result: dict[str, Any], title: str) -> Table:
    """One row per stage, one column of microseconds per request size, and the sums per side."""
    sizes = list(result["rows"])
    columns = ["stage"] + [f"{int(rows):,} rows, µs" for rows in sizes]
    table = Table(title, columns)
    for side, name in STAGES:
        key = f"{side}: {name}"
        row: dict[str, Any] = {"stage": key}
        for rows in sizes:
            row[f"{int(rows):,} rows, µs"] = result["rows"][rows]["stages_us"][key]
        table.rows.append(row)
    for side in ("client", "server"):
        row = {"stage": f"**sum, {side}**"}
        for rows in sizes:
            stages = result["rows"][rows]["stages_us"]
            row[f"{int(rows):,} rows, µs"] = sum(v for k, v in stages.items() if k.startswith(side))
        table.rows.append(row)
    alternatives = result["rows"][sizes[0]].get("alternatives_us", {})
    for key in alternatives:
        row = {"stage": f"{key} (not in the sums)"}
        for rows in sizes:
            row[f"{int(rows):,} rows, µs"] = result["rows"][rows]["alternatives_us"][key]
        table.rows.append(row)
    return table


def stage_sums_us(result: dict[str, Any], rows: int) -> dict[str, float]:
    stages = result["rows"][str(rows)]["stages_us"]
    return {side: sum(v for k, v in stages.items() if k.startswith(side)) for side in ("client", "server")}
