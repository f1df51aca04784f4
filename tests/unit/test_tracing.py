"""Tracing: the W3C trace context both sides share, what a task sends, and the server's spans of
a request and its batch, recorded by the OpenTelemetry SDK into its in-memory exporter."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from udfserve.services.model_server.core.job_context import JobContext, parse_job_context
from udfserve.services.model_server.observability import tracing as server_tracing
from udfserve.services.model_server.observability.spans import ServerTracing
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.observability.tracing import job_traceparent, task_trace_metadata
from udfserve.tracing import TRACEPARENT_KEY, TraceParent, new_traceparent, parse_traceparent

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NOT_SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


@pytest.fixture
def exported() -> tuple[ServerTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return ServerTracing(provider, sample_ratio=0.0), exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def test_a_traceparent_is_read_back_as_it_was_written() -> None:
    context = new_traceparent(sampled=True)

    assert parse_traceparent(context.header()) == context
    assert parse_traceparent(SAMPLED) == TraceParent(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, sampled=True
    )


@pytest.mark.parametrize(
    "value",
    [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    ],
)
def test_a_traceparent_w3c_says_to_ignore_is_none(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_task_sends_no_traceparent_when_tracing_is_off() -> None:
    assert task_trace_metadata(ClientConfig()) == ()


def test_every_task_of_a_job_given_one_trace_sends_that_traceparent() -> None:
    config = ClientConfig(traceparent=SAMPLED)

    assert task_trace_metadata(config) == ((TRACEPARENT_KEY, SAMPLED),)


def test_a_task_sampled_at_ratio_one_starts_a_sampled_trace_of_its_own() -> None:
    first = task_trace_metadata(ClientConfig(trace_sample_ratio=1.0))
    second = task_trace_metadata(ClientConfig(trace_sample_ratio=1.0))

    contexts = [parse_traceparent(pairs[0][1]) for pairs in (first, second)]
    assert all(context is not None and context.sampled for context in contexts)
    assert contexts[0] is not None and contexts[1] is not None
    assert contexts[0].trace_id != contexts[1].trace_id


def test_the_driver_gets_a_new_sampled_trace_when_it_traces_nothing_itself() -> None:
    context = parse_traceparent(job_traceparent())

    assert context is not None and context.sampled


def test_a_config_refuses_a_traceparent_that_is_not_one() -> None:
    with pytest.raises(ValidationError, match=r"not a W3C trace context; expected '00-<32 hex trace id>"):
        ClientConfig(traceparent="00-abc-01")


def test_the_server_keeps_the_streams_traceparent_out_of_its_log_fields() -> None:
    job = parse_job_context([(TRACEPARENT_KEY, SAMPLED), ("udfserve-spark-app-id", "app-1")])

    assert job.traceparent == SAMPLED
    assert job.log_fields() == {"app_id": "app-1"}


def test_a_server_whose_tracing_is_not_configured_turns_nothing_on() -> None:
    assert server_tracing.install(server_tracing.TracingSettings(), "cpu") is None
    assert server_tracing.ACTIVE is None


def test_a_request_of_an_unsampled_traceparent_is_not_traced(
    exported: tuple[ServerTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported

    assert tracing.request(JobContext(traceparent=NOT_SAMPLED), "m", 1) is None
    assert exporter.get_finished_spans() == ()


def test_a_request_without_traceparent_follows_the_servers_sample_ratio(
    exported: tuple[ServerTracing, InMemorySpanExporter],
) -> None:
    never, _ = exported
    always = ServerTracing(TracerProvider(), sample_ratio=1.0)

    assert never.request(JobContext(), "m", 1) is None
    assert always.request(JobContext(), "m", 1) is not None


def test_a_traced_request_and_its_batch_make_the_span_tree(
    exported: tuple[ServerTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    job = JobContext(app_id="app-1", partition_id="3", traceparent=SAMPLED)
    requests = [tracing.request(job, "tabular_mlp", batch_id) for batch_id in (1, 2)]
    assert requests[0] is not None and requests[1] is not None
    for request in requests:
        request.queued(rows=10)
    batch = tracing.batch("tabular_mlp", requests, rows=20, requests=2)
    batch.device_call(0.002, None)
    batch.end()
    for request in requests:
        request.answering()
        request.end("OK")

    spans = by_name(exporter.get_finished_spans())
    request_spans, (batch_span,), (call,) = (
        spans["udfserve.request"],
        spans["udfserve.batch"],
        spans["udfserve.device_call"],
    )
    parent = parse_traceparent(SAMPLED)
    assert parent is not None
    for span in request_spans:
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context.trace_id == parent.trace_id
        assert span.attributes is not None and span.attributes["spark.partition_id"] == "3"
        assert [link.context.span_id for link in span.links] == [batch_span.context.span_id]
    for name in ("udfserve.admission", "udfserve.queue_wait", "udfserve.answer"):
        assert sorted(s.parent.span_id for s in spans[name] if s.parent) == sorted(
            s.context.span_id for s in request_spans
        ), name
    assert batch_span.parent is not None and batch_span.parent.span_id == request_spans[0].context.span_id
    assert {link.context.span_id for link in batch_span.links} == {s.context.span_id for s in request_spans}
    assert call.parent is not None and call.parent.span_id == batch_span.context.span_id
    assert call.end_time is not None and call.start_time is not None
    assert call.end_time - call.start_time == 2_000_000


def test_a_request_refused_before_it_was_queued_has_its_admission_and_an_error_status(
    exported: tuple[ServerTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    request = tracing.request(JobContext(traceparent=SAMPLED), "tabular_mlp", 1)
    assert request is not None

    request.end("INVALID_ARGUMENT")

    spans = by_name(exporter.get_finished_spans())
    (span,) = spans["udfserve.request"]
    assert set(spans) == {"udfserve.request", "udfserve.admission"}
    assert span.status.description == "INVALID_ARGUMENT"
    assert span.attributes is not None and span.attributes["rpc.grpc.status"] == "INVALID_ARGUMENT"


def test_a_request_that_waited_for_room_has_its_room_wait_before_its_queue_wait(
    exported: tuple[ServerTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    request = tracing.request(JobContext(traceparent=SAMPLED), "tabular_mlp", 1)
    assert request is not None

    async def wait_then_run() -> None:
        hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request.queued(rows=4)
        request.waiting_for_room(hold)
        hold.set_result(None)  # rows left the queue: the request is queued now
        await asyncio.sleep(0)  # the hold's callbacks run
        batch = tracing.batch("tabular_mlp", [request], rows=4, requests=1)
        batch.end()
        request.end("OK")

    asyncio.run(wait_then_run())

    spans = by_name(exporter.get_finished_spans())
    (span,), (room_wait,), (queue_wait,) = (
        spans["udfserve.request"],
        spans["udfserve.room_wait"],
        spans["udfserve.queue_wait"],
    )
    assert room_wait.parent is not None and room_wait.parent.span_id == span.context.span_id
    assert room_wait.end_time is not None and queue_wait.start_time is not None
    assert room_wait.end_time <= queue_wait.start_time
