"""What the UDFs' functions import in a Spark Python worker, which starts as a fresh interpreter.

A ``mapInArrow`` or Arrow UDF worker imports no pandas of its own (PySpark's worker does not),
so the functions of ``predict_arrow``, ``predict_files`` and of ``remote_predict(..., udf_type="arrow")``
must not either: pandas is about 45 MiB of resident memory in each Python worker. No function
imports pydantic, whether the server is given by its address or found in the node's discovery
file: pydantic is about 15 MiB in each worker (the job carries a ``TaskConfig``, not the driver's
``ClientConfig``). The function is pickled as Spark ships it (cloudpickle), given the rows as Spark
gives them (Arrow IPC: the batches, or the input column of each, as a pandas Series for the pandas
UDF), and run in a fresh interpreter against a real server.
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

from udfserve.discovery import NodeDiscovery, ServerEntry, write_discovery
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.api.file_reads import FileScorer
from udfserve.spark_client.api.udf import ArrowPredictor
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.executor.arrow_udf import arrow_function
from udfserve.spark_client.executor.pandas_udf import pandas_function
from udfserve.spark_client.executor.partition import PredictJob
from udfserve.spark_client.wire.protocols import describe_model

MODEL = "tabular_mlp"

RUN_IN_A_FRESH_WORKER = """
import json, pickle, sys
import pyarrow as pa
function, ipc_stream, column, as_pandas = pickle.loads(sys.stdin.buffer.read())
batches = iter(pa.ipc.open_stream(ipc_stream))
inputs = batches if column is None else (batch.column(column) for batch in batches)
answers = list(function((array.to_pandas() for array in inputs) if as_pandas else inputs))
print(json.dumps({
    "answered": str(answers[0].schema.names if column is None else getattr(answers[0], "type", "a Series")),
    "rows": sum(len(answer) for answer in answers),
    "imported": sorted(name for name in ("pandas", "tensorflow", "pydantic") if name in sys.modules),
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


def run_in_a_fresh_worker(
    function: object, rows: pa.RecordBatch, column: str | None, as_pandas: bool = False
) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-c", RUN_IN_A_FRESH_WORKER],
        input=cloudpickle.dumps((function, ipc_stream_of(rows), column, as_pandas)),
        capture_output=True,
        check=True,
        timeout=60,
    )
    return dict(json.loads(completed.stdout))


def job_of(server: ServerProcess, discovery_file: Path | None = None) -> PredictJob:
    """The job the driver builds: with the server's address, or (``discovery_file``) without one,
    each task then reading the node's discovery file."""
    config = ClientConfig(address=server.grpc_target(), fallback="error").task_config()
    spec = describe_model(server.grpc_target(), config, MODEL).spec
    if discovery_file is not None:
        entry = ServerEntry(device="cpu", unix_socket=server.unix_socket, tcp_address=server.tcp_address)
        write_discovery(discovery_file, NodeDiscovery(servers=[entry]))
        config = ClientConfig(discovery_file=str(discovery_file), fallback="error").task_config()
    return PredictJob(MODEL, spec, config)


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


def test_the_pandas_udfs_function_answers_in_a_fresh_worker_without_importing_pydantic(
    server: ServerProcess,
) -> None:
    function = pandas_function(job_of(server), as_struct=False)

    worker = run_in_a_fresh_worker(function, rows_of_features(100), column="features", as_pandas=True)

    assert worker == {"answered": "a Series", "rows": 100, "imported": ["pandas"]}


def test_a_function_that_finds_its_server_in_the_discovery_file_imports_no_pydantic(
    server: ServerProcess, tmp_path: Path
) -> None:
    function = pandas_function(job_of(server, tmp_path / "discovery.json"), as_struct=False)

    worker = run_in_a_fresh_worker(function, rows_of_features(100), column="features", as_pandas=True)

    assert worker == {"answered": "a Series", "rows": 100, "imported": ["pandas"]}
