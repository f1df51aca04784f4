"""A real OTLP/gRPC trace receiver in the test process: what an OpenTelemetry Collector's ``otlp``
receiver is to a server, without the Collector (a Go binary no package index here carries).

It implements the collector's ``TraceService`` from the ``opentelemetry-proto`` package (installed
with the OTLP exporter of the ``tracing`` extra), listens on 127.0.0.1 on a port of the system's
choosing, and keeps every ``ExportTraceServiceRequest`` it is sent, so a test reads the spans a
server exported exactly as they crossed the wire.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as collector_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as collector_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span with the resource attributes of the batch it came in."""

    span: Span
    resource: dict[str, str]

    @property
    def name(self) -> str:
        return self.span.name


class TraceReceiver(collector_grpc.TraceServiceServicer):
    """Keeps each export request; answers it as accepted whole."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[collector_pb.ExportTraceServiceRequest] = []

    def Export(
        self, request: collector_pb.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> collector_pb.ExportTraceServiceResponse:
        with self._lock:
            self._requests.append(request)
        return collector_pb.ExportTraceServiceResponse()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order received."""
        with self._lock:
            requests = list(self._requests)
        return [
            ReceivedSpan(span, {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes})
            for request in requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    def wait_for_spans(
        self, trace_id: bytes, at_least: Mapping[str, int], timeout_s: float = 120.0
    ) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once ``at_least[name]`` of each name have arrived (the server
        exports in batches, seconds apart); raises ``TimeoutError`` naming what is missing."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [received for received in self.spans() if received.span.trace_id == trace_id]
            counts = Counter(received.name for received in found)
            missing = {name: count for name, count in at_least.items() if counts[name] < count}
            if not missing:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the receiver did not get, in {timeout_s:.0f}s, spans of trace {trace_id.hex()} "
                    f"as many as {missing}; it got {dict(counts)} of that trace and {len(self.spans())} "
                    "spans in all"
                )
            time.sleep(0.5)


@contextmanager
def running_receiver() -> Iterator[tuple[TraceReceiver, str]]:
    """A receiver listening on 127.0.0.1, and its ``host:port``; stopped on exit."""
    receiver = TraceReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    collector_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
