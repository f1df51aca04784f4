"""Jobs traced through the Spark conf alone: ``spark.udfserve.trace.job`` gives a job one trace,
``spark.udfserve.trace.parent`` names it, ``spark.udfserve.trace.sampleRatio`` gives each task its
own; the UDFs are built with no tracing in their config. The server traces because of its
``--tracing-spans-file`` flag, and its spans are read once it has exited."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from spark_data import feature_column

from udfserve.services.model_server.launcher import launch_server
from udfserve.services.model_server.observability.span_tree import load_spans, parent_id, trace_id
from udfserve.spark_client import ClientConfig, remote_predict

ROWS = 2_000
ROWS_PER_REQUEST = 500
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass(frozen=True)
class Jobs:
    requests: dict[str, list[dict[str, Any]]]
    """The server's request spans of each job, by the job's name (its Spark job group)."""


def run_job(spark: SparkSession, target: str, name: str, conf: dict[str, str]) -> None:
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        config = ClientConfig(address=target, fallback="error", rows_per_request=ROWS_PER_REQUEST)
        predict = remote_predict("tabular_mlp", config=config)
        spark.sparkContext.setJobGroup(name, name)
        frame = spark.range(ROWS, numPartitions=2).select(predict(feature_column((64,))))
        frame.write.format("noop").mode("overwrite").save()
    finally:
        for key in conf:
            spark.conf.unset(key)


@pytest.fixture(scope="module")
def jobs(
    spark: SparkSession, tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Jobs]:
    folder = tmp_path_factory.mktemp("trace-conf")
    spans_file = folder / "spans.jsonl"
    server = launch_server(
        tabular_onnx_repository,
        socket=folder / "grpc.sock",
        port=0,
        http_port=0,
        log_path=folder / "server.log",
        extra_args=["--models", "tabular_mlp", "--tracing-spans-file", str(spans_file)],
    )
    try:
        run_job(spark, server.grpc_target(), "job", {"spark.udfserve.trace.job": "true"})
        run_job(spark, server.grpc_target(), "parent", {"spark.udfserve.trace.parent": PARENT})
        run_job(spark, server.grpc_target(), "tasks", {"spark.udfserve.trace.sampleRatio": "1"})
        run_job(spark, server.grpc_target(), "untraced", {})
    finally:
        assert server.terminate() == 0
    by_job: dict[str, list[dict[str, Any]]] = {}
    for span in load_spans(spans_file):
        if span["name"] == "udfserve.request":
            by_job.setdefault(span["attributes"].get("spark.job_group", ""), []).append(span)
    yield Jobs(by_job)


def test_trace_job_puts_every_request_of_the_job_under_one_span_of_one_trace(jobs: Jobs) -> None:
    requests = jobs.requests["job"]

    assert len(requests) == ROWS // ROWS_PER_REQUEST
    assert len({trace_id(span) for span in requests}) == 1
    assert len({parent_id(span) for span in requests}) == 1


def test_trace_parent_puts_every_request_under_the_span_it_names(jobs: Jobs) -> None:
    requests = jobs.requests["parent"]

    assert len(requests) == ROWS // ROWS_PER_REQUEST
    assert {trace_id(span) for span in requests} == {PARENT.split("-")[1]}
    assert {parent_id(span) for span in requests} == {PARENT.split("-")[2]}


def test_trace_sample_ratio_gives_each_task_a_trace_of_its_own(jobs: Jobs) -> None:
    requests = jobs.requests["tasks"]
    partitions = {trace_id(span): span["attributes"]["spark.partition_id"] for span in requests}

    assert len(requests) == ROWS // ROWS_PER_REQUEST
    assert sorted(partitions.values()) == ["0", "1"]


def test_a_job_without_trace_keys_leaves_no_span(jobs: Jobs) -> None:
    assert "untraced" not in jobs.requests
    assert set(jobs.requests) == {"job", "parent", "tasks"}
