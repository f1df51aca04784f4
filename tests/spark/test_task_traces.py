"""One Spark task traced through a real server: the job's traceparent reaches the server, whose
spans (exported by the OpenTelemetry SDK to a JSON-lines file, read once it has exited) form the
tree of each request of the task and of the batches they ran in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from spark_data import feature_column

from udfserve.services.model_server.launcher import launch_server
from udfserve.services.model_server.observability.span_tree import (
    load_spans,
    parent_id,
    render,
    span_id,
    trace_id,
)
from udfserve.spark_client import ClientConfig, remote_predict
from udfserve.spark_client.observability.tracing import job_traceparent
from udfserve.tracing import parse_traceparent

ROWS = 3_000
ROWS_PER_REQUEST = 1_000


@dataclass(frozen=True)
class TracedJobs:
    spans: list[dict[str, Any]]
    traced: str
    """The trace id of the job given a sampled traceparent."""
    job_span: str
    """The span id of its traceparent: the driver's span the requests belong under."""
    untraced: str
    """The trace id of the job given an unsampled one."""
    exit_code: int


def run_job(spark: SparkSession, target: str, traceparent: str) -> None:
    predict = remote_predict(
        "tabular_mlp",
        config=ClientConfig(
            address=target, fallback="error", rows_per_request=ROWS_PER_REQUEST, traceparent=traceparent
        ),
    )
    frame = spark.range(ROWS, numPartitions=1).select(predict(feature_column((64,))))
    frame.write.format("noop").mode("overwrite").save()


@pytest.fixture(scope="module")
def traced_jobs(
    spark: SparkSession, tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TracedJobs]:
    """A server exporting its spans to a file, one job of one task with a sampled traceparent and
    one with an unsampled one; the server stopped (its spans flushed) before they are read."""
    folder = tmp_path_factory.mktemp("traced")
    spans_file = folder / "spans.jsonl"
    env = {**os.environ, "UDFSERVE_TRACING_SPANS_FILE": str(spans_file)}
    server = launch_server(
        tabular_onnx_repository,
        socket=folder / "grpc.sock",
        port=0,
        http_port=0,
        env=env,
        log_path=folder / "server.log",
        extra_args=["--models", "tabular_mlp"],
    )
    try:
        traced, untraced = job_traceparent(sampled=True), job_traceparent(sampled=False)
        run_job(spark, server.grpc_target(), traced)
        run_job(spark, server.grpc_target(), untraced)
    finally:
        exit_code = server.terminate()
    traced_context, untraced_context = parse_traceparent(traced), parse_traceparent(untraced)
    assert traced_context is not None and untraced_context is not None
    yield TracedJobs(
        load_spans(spans_file),
        traced_context.trace_id_hex,
        f"{traced_context.span_id:016x}",
        untraced_context.trace_id_hex,
        exit_code,
    )


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def test_each_request_of_the_task_is_a_child_of_the_jobs_span(traced_jobs: TracedJobs) -> None:
    spans = [span for span in traced_jobs.spans if trace_id(span) == traced_jobs.traced]
    requests = named(spans, "udfserve.request")

    assert traced_jobs.exit_code == 0
    assert len(requests) == ROWS // ROWS_PER_REQUEST
    assert {parent_id(span) for span in requests} == {traced_jobs.job_span}
    assert {span["attributes"]["spark.partition_id"] for span in requests} == {"0"}
    assert sum(span["attributes"]["udfserve.rows"] for span in requests) == ROWS
    assert {span["attributes"]["rpc.grpc.status"] for span in requests} == {"OK"}


def test_each_request_has_its_admission_queue_wait_and_answer(traced_jobs: TracedJobs) -> None:
    spans = [span for span in traced_jobs.spans if trace_id(span) == traced_jobs.traced]
    requests = {span_id(span) for span in named(spans, "udfserve.request")}

    for phase in ("udfserve.admission", "udfserve.queue_wait", "udfserve.answer"):
        assert sorted(parent_id(span) or "" for span in named(spans, phase)) == sorted(requests), phase


def test_every_request_is_linked_to_a_batch_whose_device_call_is_its_child(traced_jobs: TracedJobs) -> None:
    spans = [span for span in traced_jobs.spans if trace_id(span) == traced_jobs.traced]
    requests = {span_id(span) for span in named(spans, "udfserve.request")}
    batches = named(spans, "udfserve.batch")
    linked = {link["context"]["span_id"].removeprefix("0x") for batch in batches for link in batch["links"]}
    calls = named(spans, "udfserve.device_call")

    assert linked == requests
    assert {parent_id(batch) for batch in batches} <= requests
    assert sorted(parent_id(call) or "" for call in calls) == sorted(span_id(batch) for batch in batches)
    assert sum(batch["attributes"]["udfserve.batch.rows"] for batch in batches) == ROWS


def test_a_job_whose_traceparent_is_not_sampled_leaves_no_span(traced_jobs: TracedJobs) -> None:
    assert [span for span in traced_jobs.spans if trace_id(span) == traced_jobs.untraced] == []
    assert {trace_id(span) for span in traced_jobs.spans} == {traced_jobs.traced}


def test_the_trace_renders_as_a_tree_under_the_jobs_span(traced_jobs: TracedJobs) -> None:
    tree = render(traced_jobs.spans, traced_jobs.traced)

    assert (
        tree.splitlines()[1] == f"└── (span {traced_jobs.job_span}: the client's, not exported by the server)"
    )
    assert tree.count("├── udfserve.request") == ROWS // ROWS_PER_REQUEST
    assert "│   ├── udfserve.device_call" in tree
