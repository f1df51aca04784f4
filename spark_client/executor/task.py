"""What every UDF's function runs in a Spark task: the task's partition answered in order, with
the task's placement read from Spark and its statistics added to the job's accumulator.

``predict_arrow``'s class, and the functions of the pandas and the Arrow UDF, all answer their
partitions here. It imports no pandas (``predict_arrow``'s workers stay pandas-free) and
PySpark only inside the functions that run in a task.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator

import pyarrow as pa

from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.executor.rechunk import Carry, Pieces, Rechunker
from udfserve.spark_client.nodes.fallback_report import report_fallback_rows
from udfserve.spark_client.nodes.routing import TaskPlacement, placement_from_resources
from udfserve.spark_client.observability.job_context import SparkJobContext
from udfserve.spark_client.observability.stats import ClientStats


def task_placement() -> TaskPlacement:
    """The running task's partition id and the GPU addresses Spark assigned to it."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return TaskPlacement()
    resources = {name: list(info.addresses) for name, info in context.resources().items()}
    return placement_from_resources(context.partitionId(), resources)


def answer_partition(
    job: PredictJob, batches: Iterable[tuple[Carry, pa.RecordBatch | Pieces]]
) -> Iterator[tuple[Carry, pa.RecordBatch]]:
    """One partition's Spark batches answered in order, each with what it came with: cut into
    requests of the job's size, sent to the task's server (or the CPU fallback), counted into
    the job's accumulator however the partition ends (and the fallback's rows reported to the
    node's supervisor). Both UDFs run their partitions here. A UDF
    of a ``node_servers`` context first makes sure its host runs a node, without waiting for it."""
    if job.config.node_start is not None:  # a UDF of a node_servers context: this host's node first
        from udfserve.spark_client.nodes.node_ensure import ensure_for_task

        ensure_for_task(job.config.node_start, os.environ)
    rechunker: Rechunker[Carry] = Rechunker(
        job.config.rows_per_request, job.config.max_message_bytes, job.empty_answer()
    )
    with counted(job) as (context, stats):
        answers = predict_partition(
            job, rechunker.requests(batches), os.environ, task_placement(), context=context, stats=stats
        )
        yield from rechunker.answers(answers)


@contextlib.contextmanager
def counted(job: PredictJob) -> Iterator[tuple[SparkJobContext, ClientStats]]:
    """The task's job context, and statistics added to the job's accumulator once the partition
    ends, however it ends (exhausted, or closed early by a ``limit``)."""
    from pyspark import TaskContext

    stats = ClientStats()
    started = time.perf_counter()
    context = job.application.for_task(TaskContext.get())
    try:
        yield context, stats
    finally:
        stats.tasks += 1
        stats.task_s += time.perf_counter() - started
        if job.counters is not None:
            job.counters.add(stats)
        if stats.rows_by_fallback:  # where the node's supervisor exports them (fallback_report.py)
            report_fallback_rows(job.config, os.environ, context.app_id, job.model, stats.rows_by_fallback)
