"""A server started with ``--tracing-otlp-endpoint`` exports its spans over OTLP/gRPC, as it would
to an OpenTelemetry Collector: a real receiver in this process (``otlp_receiver``) gets them, with
the service's resource, every span the server records of a request, the trace of the request's
``traceparent``, and the batch's links. And a collector that is down costs spans, not answers.

The servers serve the tabular model's ONNX graph: the spans are the server's, whatever backend
computes, and a server starts without TensorFlow's import.

The server exports in batches (the SDK's batch processor, a few seconds apart): the tests wait for
the spans, or for the log line, with a deadline of minutes.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from otlp_receiver import ReceivedSpan, TraceReceiver, running_receiver
from server_harness import batch_of, request, running_server

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.tracing import TRACEPARENT_KEY, new_traceparent

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="needs udfserve[tracing]")

SERVICE = "udfserve-otlp-check"
REQUESTS = 8
RECORDED = {
    "udfserve.request": REQUESTS,
    "udfserve.admission": REQUESTS,
    "udfserve.queue_wait": REQUESTS,
    "udfserve.answer": REQUESTS,
    "udfserve.batch": 1,
    "udfserve.device_call": 1,
}
"""The spans the server records of ``REQUESTS`` answered requests: each request's own, and at
least one batch (requests that arrive together are merged) with its device call."""


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[TraceReceiver, str]]:
    with running_receiver() as running:
        yield running


def tracing_server_args(endpoint: str) -> list[str]:
    return [
        "--models",
        "tabular_mlp",
        "--tracing-otlp-endpoint",
        endpoint,
        "--tracing-otlp-insecure",
        "--tracing-sample-ratio",
        "1",
        "--tracing-service-name",
        SERVICE,
    ]


@pytest.fixture(scope="module")
def server(
    receiver: tuple[TraceReceiver, str],
    tabular_onnx_repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    with running_server(
        tabular_onnx_repository, socket_dir, tmp_path_factory, "otlp", tracing_server_args(receiver[1])
    ) as process:
        yield process


def predict_traced(server: ServerProcess, traceparent: str, requests: int) -> list[str]:
    """``requests`` requests on one Predict stream carrying ``traceparent``; the error of each
    answer that is one (none when all were answered)."""
    inputs = batch_of({"features": np.zeros((4, 64), np.float32)})
    with grpc.insecure_channel(server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        answers = list(
            stub.Predict(
                iter([request("tabular_mlp", inputs, batch_id) for batch_id in range(requests)]),
                timeout=120,
                metadata=((TRACEPARENT_KEY, traceparent),),
            )
        )
    assert len(answers) == requests
    return [answer.error.message for answer in answers if answer.HasField("error")]


@pytest.fixture(scope="module")
def exported(
    server: ServerProcess, receiver: tuple[TraceReceiver, str]
) -> tuple[list[ReceivedSpan], bytes, bytes]:
    """The spans of one traced stream of ``REQUESTS`` requests as the receiver got them, and the
    trace id and parent span id of the stream's traceparent."""
    parent = new_traceparent(sampled=True)
    assert predict_traced(server, parent.header(), REQUESTS) == []
    trace_id = parent.trace_id.to_bytes(16, "big")
    spans = receiver[0].wait_for_spans(trace_id, RECORDED)
    return spans, trace_id, parent.span_id.to_bytes(8, "big")


def test_exported_spans_carry_the_service_name_and_device_resource(
    exported: tuple[list[ReceivedSpan], bytes, bytes],
) -> None:
    spans, _, _ = exported

    assert {span.resource.get("service.name") for span in spans} == {SERVICE}
    assert {span.resource.get("udfserve.device") for span in spans} == {"cpu"}


def test_every_span_the_server_records_of_a_request_is_exported(
    exported: tuple[list[ReceivedSpan], bytes, bytes],
) -> None:
    spans, _, _ = exported
    names = [span.name for span in spans]

    for name in ("udfserve.request", "udfserve.admission", "udfserve.queue_wait", "udfserve.answer"):
        assert names.count(name) == REQUESTS, (name, names)
    # all batches ended before the last request's span did: the export order is the end order
    assert 1 <= names.count("udfserve.batch") == names.count("udfserve.device_call") <= REQUESTS, names


def test_the_request_spans_sit_under_the_traceparent_the_stream_carried(
    exported: tuple[list[ReceivedSpan], bytes, bytes],
) -> None:
    spans, trace_id, parent_span_id = exported

    assert {span.span.trace_id for span in spans} == {trace_id}
    requests = [span for span in spans if span.name == "udfserve.request"]
    assert requests
    assert {span.span.parent_span_id for span in requests} == {parent_span_id}


def test_a_batch_span_is_linked_to_the_request_spans_it_merged(
    exported: tuple[list[ReceivedSpan], bytes, bytes],
) -> None:
    spans, trace_id, _ = exported
    request_ids = {span.span.span_id for span in spans if span.name == "udfserve.request"}
    batches = [span for span in spans if span.name == "udfserve.batch"]

    assert batches
    for batch in batches:
        assert batch.span.links, f"batch span {batch.span.span_id.hex()} has no links"
        assert {link.trace_id for link in batch.span.links} == {trace_id}
        assert {link.span_id for link in batch.span.links} <= request_ids
        assert len(batch.span.links) == next(
            kv.value.int_value for kv in batch.span.attributes if kv.key == "udfserve.batch.requests"
        )


def unused_port() -> int:
    """A port nothing listens on: one the system gave a socket that is closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


EXPORT_TRIED = "Reinitializing gRPC channel for traces exporter"
"""The exporter's debug line at the first failed try of each export to a collector that is down."""


def test_a_collector_that_is_down_costs_the_spans_not_the_answers_and_is_logged_once_not_per_export(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    endpoint = f"127.0.0.1:{unused_port()}"
    args = [*tracing_server_args(endpoint), "--log-level", "DEBUG"]
    with running_server(tabular_onnx_repository, socket_dir, tmp_path_factory, "otlp-down", args) as server:
        assert server.log_path is not None
        for exports in (1, 2, 3):
            # the spans of each round go in the export after the last one failed: one worker
            assert predict_traced(server, new_traceparent(sampled=True).header(), 40) == []
            wait_for_log(server.log_path, EXPORT_TRIED, times=exports)
        log = server.log_path.read_text()

    about_the_collector = [line for line in log.splitlines() if endpoint in line and "DEBUG" not in line]
    assert sum("Failed to export traces" in line for line in about_the_collector) == 1, about_the_collector
    assert sum("Transient error" in line for line in about_the_collector) == 1, about_the_collector


def wait_for_log(path: Path, text: str, times: int, timeout_s: float = 180.0) -> None:
    """Return once ``text`` is in the log ``times`` times (an export fails after its retries,
    seconds after it began); raise ``TimeoutError`` with the log when not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while path.read_text().count(text) < times:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{text!r} not {times} times in the server's log in {timeout_s:.0f}s:\n{path.read_text()}"
            )
        time.sleep(0.2)  # a short look between reads of a file another process writes
