"""What an executor's Python worker runs for ``predict_arrow``, without Spark.

``ArrowPredictor.__call__`` (``spark_client/api/udf.py``) converts each Arrow batch to a request,
cuts the requests to the job's size, answers them through ``predict_partition`` (routing by the
node's discovery file, the unix socket, shared memory, the in-flight window) and appends the
answers to the batches. ``score`` runs those same functions; the only part of a task it leaves
out is reading the task's placement and adding the counts to an accumulator, which need
PySpark's ``TaskContext``: here the placement is given and the counts come back as
``ClientStats``. Nothing here imports PySpark, pandas, torch or TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from udfserve.spark_client.api.udf import describe_in_driver
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.executor.convert import answer_to_spark_columns, arrow_to_request
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.executor.rechunk import Rechunker, planned_request_rows
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats

ID_COLUMN = "id"


def job_for(model: str, config: ClientConfig) -> PredictJob:
    """The job ``arrow_predictor`` builds in the driver: the model described by the server the
    config finds, requests of the rows ``build_job`` plans for it."""
    task = config.task_config()
    described = describe_in_driver(model, task)
    rows = planned_request_rows(
        config.rows_per_request,
        config.bytes_per_request,
        described.spec.input_bytes_per_row(),
        described.max_rows_per_request,
    )
    return PredictJob(model, described.spec, dataclasses.replace(task, rows_per_request=rows))


def score(
    job: PredictJob,
    batches: Iterable[pa.RecordBatch],
    input_columns: Sequence[str],
    output_columns: Sequence[str],
    stats: ClientStats,
    partition_id: int = 0,
) -> Iterator[pa.RecordBatch]:
    """Each batch with the model's outputs appended, in order, as ``ArrowPredictor`` yields it."""
    rechunker: Rechunker[pa.RecordBatch] = Rechunker(
        job.config.rows_per_request, job.config.max_message_bytes, job.empty_answer()
    )
    requests = ((batch, arrow_to_request(batch, input_columns, job.spec)) for batch in batches)
    answers = predict_partition(
        job, rechunker.requests(requests), os.environ, TaskPlacement(partition_id=partition_id), stats=stats
    )
    for original, answer in rechunker.answers(answers):
        columns = answer_to_spark_columns(answer, job.spec)
        yield pa.RecordBatch.from_arrays(
            [*original.columns, *columns], names=[*original.schema.names, *output_columns]
        )


def spark_batches(values: np.ndarray, first_id: int, batch_rows: int, column: str) -> list[pa.RecordBatch]:
    """``values`` (rows x features, float32) as Spark hands them to ``mapInArrow``: batches of an
    ``id`` column and an ``array<float>`` column (Arrow ``list<float>``)."""
    batches = []
    for start in range(0, len(values), batch_rows):
        chunk = values[start : start + batch_rows]
        ids = np.arange(first_id + start, first_id + start + len(chunk), dtype=np.int64)
        batches.append(
            pa.RecordBatch.from_arrays([numpy_array(ids), list_array(chunk)], names=[ID_COLUMN, column])
        )
    return batches


def numpy_array(values: np.ndarray) -> pa.Array:
    """A one-dimensional numpy array as Arrow, from its buffer: ``pa.array`` would import pandas,
    which the Python workers of the Arrow UDFs never load."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def list_array(rows: np.ndarray) -> pa.Array:
    """A rows x width float32 matrix as the ``list<float>`` column of a Spark ``array<float>``."""
    flat = numpy_array(rows.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, rows.shape[1]).cast(pa.list_(pa.float32()))


def int64_values(array: pa.Array) -> np.ndarray:
    """An int64 column without nulls as numpy, read from its buffer: ``Array.to_numpy`` imports pandas."""
    return np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array), offset=array.offset * 8)


def output_matrix(batches: Sequence[pa.RecordBatch], column: str) -> np.ndarray:
    """An appended ``array<float>`` column of every batch as one rows x width float32 matrix."""
    parts = []
    for batch in batches:
        values = batch.column(column)
        width = len(values[0]) if len(values) else 0
        parts.append(values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), width))
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
