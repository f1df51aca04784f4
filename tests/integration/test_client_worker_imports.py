"""What the UDFs' functions import in a Spark Python worker, which starts as a fresh interpreter.

A ``mapInArrow`` worker imports no pandas of its own (PySpark's worker does not), so
``predict_arrow``'s function must not either: pandas is about 45 MiB of resident memory in each
Python worker. The function is pickled as Spark ships it (cloudpickle), given the rows as Spark
gives them (Arrow IPC), and run in a fresh interpreter against a real server.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
from pyspark import cloudpickle

from services.model_server.launcher import ServerProcess
from spark_client.config import ClientConfig
from spark_client.partition import PredictJob
from spark_client.protocols import describe_model
from spark_client.udf import ArrowPredictor

MODEL = "tabular_mlp"

RUN_IN_A_FRESH_WORKER = """
import json, pickle, sys
import pyarrow as pa
function, ipc_stream = pickle.loads(sys.stdin.buffer.read())
rows = [batch for answer in function(iter(pa.ipc.open_stream(ipc_stream))) for batch in [answer]]
print(json.dumps({
    "columns": rows[0].schema.names,
    "rows": sum(batch.num_rows for batch in rows),
    "imported": sorted(name for name in ("pandas", "tensorflow") if name in sys.modules),
}))
"""


def ipc_stream_of(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_predict_arrows_function_answers_in_a_fresh_worker_without_importing_pandas(
    server: ServerProcess,
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    spec = describe_model(config.address or "", config, MODEL).spec
    predictor = ArrowPredictor(PredictJob(MODEL, spec, config), ("features",), ("scores",))
    values = np.random.default_rng(0).normal(size=(100 * 64)).astype(np.float32)
    features = pa.FixedSizeListArray.from_arrays(pa.array(values), 64).cast(pa.list_(pa.float32()))
    rows = pa.RecordBatch.from_arrays([pa.array(np.arange(100)), features], names=["id", "features"])

    completed = subprocess.run(
        [sys.executable, "-c", RUN_IN_A_FRESH_WORKER],
        input=cloudpickle.dumps((predictor, ipc_stream_of(rows))),
        capture_output=True,
        check=True,
        timeout=60,
    )
    worker = json.loads(completed.stdout)

    assert worker["columns"] == ["id", "features", "scores"]
    assert worker["rows"] == 100
    assert worker["imported"] == []
