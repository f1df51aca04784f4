"""Where finished spans go: the OpenTelemetry SDK's provider, with an OTLP exporter to a collector
and a file of JSON lines. Imported only when tracing is configured (the ``tracing`` extra).

Spans leave the event loop in batches (``BatchSpanProcessor``): exporting costs the request path
a queue append, and a collector that is down costs dropped spans, never a slower answer, and a
few lines of log (``export_log``), not a line per export.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from udfserve import __version__
from udfserve.services.model_server.observability.export_log import bound_export_failure_log


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span to a file as one JSON object a line (the SDK's ``ReadableSpan.to_json``):
    spans a test, or an operator without a collector, can read with any JSON tool."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tracer_provider(
    service_name: str,
    device: str,
    otlp_endpoint: str | None,
    otlp_insecure: bool,
    spans_file: Path | None,
) -> TracerProvider:
    """A provider that records every span it is asked for (the request path decided already,
    ``spans.ServerTracing.request``) and exports to the collector at ``otlp_endpoint`` and to
    ``spans_file``, each where given (``tracing.TracingSettings``)."""
    resource = Resource.create(
        {"service.name": service_name, "service.version": __version__, "udfserve.device": device}
    )
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        bound_export_failure_log()
        exporter = OTLPSpanExporter(endpoint=otlp_endpoint, insecure=otlp_insecure)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if spans_file is not None:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(spans_file)))
    return provider
