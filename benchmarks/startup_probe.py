"""What a fresh Python process pays before its first prediction, measured from inside it.

Two ways a Spark Python worker gets to its first prediction:

- ``inprocess``: import TensorFlow, load the Keras model, call it (through a ``tf.function``,
  the fastest in-process path; its first call traces the graph);
- ``remote``: import the client stack (grpc, pyarrow, the wire contract), open a channel to a
  running model server, send the first request.

Each prints one JSON line: seconds per step and the resident memory after each, so the parent
sees the cost without its own imports getting in the way.

    python -m benchmarks.startup_probe inprocess --model-file M.keras --rows 1024
    python -m benchmarks.startup_probe remote --target unix:///path.sock --model tabular_mlp --rows 1024
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

_STARTED = time.perf_counter()


def _rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def _peak_rss_mib() -> float:
    """The peak resident memory of this process image (``VmHWM``). ``ru_maxrss`` would not do:
    Linux carries it over ``exec`` from the parent that forked this interpreter."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def inprocess(model_file: str, rows: int) -> dict[str, Any]:
    result: dict[str, Any] = {"rss_start_mib": _rss_mib()}
    started = time.perf_counter()
    import numpy as np
    import tensorflow as tf

    result["import_s"] = time.perf_counter() - started
    result["rss_after_import_mib"] = _rss_mib()
    import keras

    started = time.perf_counter()
    model = keras.saving.load_model(model_file, compile=False)
    result["load_s"] = time.perf_counter() - started
    result["rss_after_load_mib"] = _rss_mib()
    width = int(model.inputs[0].shape[-1])
    call = tf.function(lambda x: model(x, training=False), input_signature=[tf.TensorSpec([None, width])])
    batch = np.random.default_rng(0).standard_normal((rows, width), dtype=np.float32)
    started = time.perf_counter()
    call(batch).numpy()
    result["first_call_s"] = time.perf_counter() - started
    result["to_first_prediction_s"] = time.perf_counter() - _STARTED
    started = time.perf_counter()
    call(batch).numpy()
    result["second_call_s"] = time.perf_counter() - started
    result["rss_end_mib"] = _rss_mib()
    result["rss_peak_mib"] = _peak_rss_mib()
    return result


def remote(target: str, model: str, rows: int) -> dict[str, Any]:
    result: dict[str, Any] = {"rss_start_mib": _rss_mib()}
    started = time.perf_counter()
    import grpc
    import numpy as np
    import pyarrow as pa

    from udfserve.protocol import inference_pb2 as pb
    from udfserve.protocol import inference_pb2_grpc as pb_grpc
    from udfserve.protocol.arrow_ipc import decode_batch, encode_batch

    result["import_s"] = time.perf_counter() - started
    result["rss_after_import_mib"] = _rss_mib()
    values = np.random.default_rng(0).standard_normal(rows * 64, dtype=np.float32)
    offsets = np.arange(0, rows * 64 + 1, 64, dtype=np.int32)
    batch = pa.record_batch({"features": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})

    def predict(stub: pb_grpc.InferenceStub, batch_id: int) -> None:
        request = pb.PredictRequest(model=model, batch_id=batch_id, arrow_ipc=encode_batch(batch))
        for response in stub.Predict(iter([request]), timeout=60):
            if response.HasField("error"):
                raise RuntimeError(f"model {model!r}: {response.error.message}")
            decode_batch(response.arrow_ipc)

    started = time.perf_counter()
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        predict(stub, 1)
        result["first_call_s"] = time.perf_counter() - started
        result["to_first_prediction_s"] = time.perf_counter() - _STARTED
        started = time.perf_counter()
        predict(stub, 2)
        result["second_call_s"] = time.perf_counter() - started
    result["load_s"] = 0.0
    result["rss_end_mib"] = _rss_mib()
    result["rss_peak_mib"] = _peak_rss_mib()
    return result


def remote_udf_memory(target: str, model: str, batches: int, batch_rows: int, width: int) -> dict[str, Any]:
    """Resident memory of a worker on the remote path, step by step: what a pandas UDF worker
    imports anyway, what the client adds, and what streaming ``batches`` Arrow batches adds.

    The batches go through the function ``remote_predict`` ships to the executors, fed as Spark
    feeds an iterator pandas UDF: a pandas Series of numpy arrays per batch.
    """
    steps: dict[str, float] = {"interpreter": _rss_mib()}
    peaks: dict[str, float] = {"interpreter": _peak_rss_mib()}

    def step(name: str) -> None:
        steps[name] = _rss_mib()
        peaks[name] = _peak_rss_mib()

    import numpy as np
    import pandas  # noqa: F401 (what a pandas UDF worker imports anyway)
    import pyarrow as pa

    step("numpy, pandas, pyarrow (any pandas UDF)")
    import pyspark.sql  # noqa: F401 (a Spark Python worker has it loaded)

    step("pyspark")
    import grpc  # noqa: F401

    step("grpc")
    from udfserve.spark_client.api.udf import build_job
    from udfserve.spark_client.executor.pandas_udf import predict_pandas

    step("spark_client")
    job = build_job(model, None, {"address": target})
    step("model spec fetched, channel open")
    rng = np.random.default_rng(0)
    values = rng.standard_normal(batch_rows * width, dtype=np.float32)
    offsets = np.arange(0, batch_rows * width + 1, width, dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    series = column.to_pandas()  # what Spark hands an iterator pandas UDF: a Series of arrays
    step("one input batch as pandas")
    rows = 0
    for answer in predict_pandas(job, iter([series] * batches), as_struct=False):
        rows += len(answer)
    step(f"after streaming {batches} batches of {batch_rows:,} rows")
    if rows != batches * batch_rows:
        raise RuntimeError(f"expected {batches * batch_rows} rows back, received {rows}")
    return {"steps_mib": steps, "peak_after_steps_mib": peaks, "rss_peak_mib": _peak_rss_mib()}


def probe_in_child(args: Sequence[str]) -> dict[str, Any]:
    """Run this module in a fresh interpreter; returns what it measured."""
    # Imported here: the probe itself must start with nothing but the standard library loaded.
    from benchmarks.processes import child_env

    command = [sys.executable, "-m", "benchmarks.startup_probe", *args]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=child_env(), check=False)
    wall_s = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(
            f"start-up probe {' '.join(args[:1])} failed with exit code {completed.returncode}: "
            f"{completed.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall_s
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser("inprocess")
    local.add_argument("--model-file", required=True)
    local.add_argument("--rows", type=int, default=1024)
    far = commands.add_parser("remote")
    far.add_argument("--target", required=True)
    far.add_argument("--model", default="tabular_mlp")
    far.add_argument("--rows", type=int, default=1024)
    memory = commands.add_parser("udf-memory")
    memory.add_argument("--target", required=True)
    memory.add_argument("--model", default="tabular_mlp")
    memory.add_argument("--batches", type=int, default=30)
    memory.add_argument("--batch-rows", type=int, default=16384)
    memory.add_argument("--width", type=int, default=64, help="float32 values per row of the input")
    args = parser.parse_args(argv)
    if args.command == "inprocess":
        result = inprocess(args.model_file, args.rows)
    elif args.command == "remote":
        result = remote(args.target, args.model, args.rows)
    else:
        result = remote_udf_memory(args.target, args.model, args.batches, args.batch_rows, args.width)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
