"""What the UDFs' functions import in a Spark Python worker, which starts as a fresh interpreter.

A ``mapInArrow`` or Arrow UDF worker imports no pandas of its own (PySpark's worker does not),
so the functions of ``predict_arrow``, ``predict_files`` and of ``remote_predict(..., udf_type="arrow")``
must not either: pandas is about 45 MiB of resident memory in each Python worker. The function is pickled
as Spark ships it (cloudpickle), given the rows as Spark gives them (Arrow IPC: the batches, or
the input column of each), and run in a fresh interpreter against a real server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import cloudpickle

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.api.file_reads import FileScorer
from udfserve.spark_client.api.udf import ArrowPredictor
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.executor.arrow_udf import arrow_function
from udfserve.spark_client.executor.partition import PredictJob
from udfserve.spark_client.wire.protocols import describe_model

MODEL = "tabular_mlp"

RUN_IN_A_FRESH_WORKER = """
import json, pickle, sys
import pyarrow as pa
function, ipc_stream, column = pickle.loads(sys.stdin.buffer.read())
batches = iter(pa.ipc.open_stream(ipc_stream))
answers = list(function(batches if column is None else (batch.column(column) for batch in batches)))
print(json.dumps({
    "answered": str(answers[0].schema.names if column is None else answers[0].type),
    "rows": sum(len(answer) for answer in answers),
    "imported": sorted(name for name in ("pandas", "tensorflow") if name in sys.modules),
}))
"""


def ipc_stream_of(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def rows_of_features(count: int) -> pa.RecordBatch:
    values = np.random.default_rng(0).normal(size=(count * 64)).astype(np.float32)
    features = pa.FixedSizeListArray.from_arrays(pa.array(values), 64).cast(pa.list_(pa.float32()))
    return pa.RecordBatch.from_arrays([pa.array(np.arange(count)), features], names=["id", "features"])


def run_in_a_fresh_worker(function: object, rows: pa.RecordBatch, column: str | None) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-c", RUN_IN_A_FRESH_WORKER],
        input=cloudpickle.dumps((function, ipc_stream_of(rows), column)),
        capture_output=True,
        check=True,
        timeout=60,
    )
    return dict(json.loads(completed.stdout))


def job_of(server: ServerProcess) -> PredictJob:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    return PredictJob(MODEL, describe_model(config.address or "", config, MODEL).spec, config)


def test_predict_arrows_function_answers_in_a_fresh_worker_without_importing_pandas(
    server: ServerProcess,
) -> None:
    predictor = ArrowPredictor(job_of(server), ("features",), ("scores",))

    worker = run_in_a_fresh_worker(predictor, rows_of_features(100), column=None)

    assert worker == {"answered": "['id', 'features', 'scores']", "rows": 100, "imported": []}


def test_the_arrow_udfs_function_answers_in_a_fresh_worker_without_importing_pandas(
    server: ServerProcess,
) -> None:
    function = arrow_function(job_of(server), as_struct=False)

    worker = run_in_a_fresh_worker(function, rows_of_features(100), column="features")

    assert worker == {"answered": "list<item: float>", "rows": 100, "imported": []}


def test_predict_files_function_reads_and_answers_in_a_fresh_worker_without_importing_pandas(
    server: ServerProcess, tmp_path: Path
) -> None:
    pq.write_table(pa.Table.from_batches([rows_of_features(100)]), tmp_path / "part-0.parquet")
    predictor = ArrowPredictor(job_of(server), ("features",), ("scores",))
    scorer = FileScorer(
        predictor, ("id", "features"), ("id", "scores"), rows_of_features(0).schema, read_batch_rows=32
    )
    splits = pa.RecordBatch.from_pylist(
        [
            {
                "path": str(tmp_path / "part-0.parquet"),
                "row_groups": [],
                "planned_bytes": 0,
                "planned_group_rows": [],
                "planned_group_bytes": [],
            }
        ]
    )

    worker = run_in_a_fresh_worker(scorer, splits, column=None)

    assert worker == {"answered": "['id', 'scores']", "rows": 100, "imported": []}
