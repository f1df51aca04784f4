"""Whether this server traces requests with OpenTelemetry, and its settings: off unless configured.

Tracing is on when spans have somewhere to go: an OTLP collector (``--tracing-otlp-endpoint``,
``UDFSERVE_TRACING_OTLP_ENDPOINT``) or a file of JSON lines (``--tracing-spans-file``). Then
``ACTIVE`` holds the process's ``spans.ServerTracing``, and the request path records, for each
sampled request, spans for its admission, its wait in the queue, the merged batch it ran in
(linked to every traced request it merged) with the device call, and its answer. Off, ``ACTIVE``
is None: the request path tests it once per request and once per batch, makes no span object,
and nothing of OpenTelemetry is imported (the SDK and the OTLP exporter come with the ``tracing`` extra).

Which requests are traced: one whose stream came with a W3C ``traceparent`` (the Spark client's
``trace_sample_ratio`` or ``traceparent``) when its sampled flag is set, as W3C asks; one without,
with the probability ``--tracing-sample-ratio``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from udfserve.services.model_server.observability.spans import ServerTracing

logger = logging.getLogger(__name__)

ACTIVE: ServerTracing | None = None
"""The process's tracing while it is on; None when off (the request path's one test)."""


class TracingSettings(BaseModel):
    """The tracing settings of a server: a group of its settings (``--tracing-*``, the
    ``UDFSERVE_TRACING_*`` variables, or a ``--config`` file's ``tracing_*`` keys). A node has them
    too and gives its value of each to every server it starts (``shared_settings``)."""

    tracing_otlp_endpoint: str | None = Field(
        default=None,
        description="the OTLP/gRPC collector spans are exported to, such as http://collector:4317 "
        "(tracing is on when this or --tracing-spans-file is given; needs udfserve[tracing]; default: none)",
    )
    tracing_otlp_insecure: bool = Field(
        default=True,
        description="talk to the OTLP collector without TLS (a collector on the node or the pod)",
    )
    tracing_spans_file: Path | None = Field(
        default=None,
        description="a file each finished span is appended to, one JSON object a line, for tools or "
        "tests without a collector (default: none)",
    )
    tracing_sample_ratio: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of the requests that come without a W3C traceparent that are traced (a "
        "request with one is traced when its sampled flag is set)",
    )
    tracing_service_name: str = Field(
        default="udfserve-model-server", min_length=1, description="the service.name of the spans"
    )

    @property
    def tracing_enabled(self) -> bool:
        """Whether spans have somewhere to go."""
        return self.tracing_otlp_endpoint is not None or self.tracing_spans_file is not None


def install(settings: TracingSettings, device: str) -> ServerTracing | None:
    """Turn tracing on for this process when ``settings`` give spans somewhere to go; None when
    off. Raises ``RuntimeError`` naming the extra when the OpenTelemetry SDK is not installed."""
    global ACTIVE
    if not settings.tracing_enabled:
        ACTIVE = None
        return None
    try:
        from udfserve.services.model_server.observability.trace_export import tracer_provider
    except ImportError as exc:
        raise RuntimeError(
            f"tracing is configured (--tracing-otlp-endpoint or --tracing-spans-file) but the OpenTelemetry "
            f"SDK is missing ({exc}); "
            "expected it installed: pip install 'udfserve[tracing]'"
        ) from exc
    from udfserve.services.model_server.observability.spans import ServerTracing

    provider = tracer_provider(
        settings.tracing_service_name,
        device,
        settings.tracing_otlp_endpoint,
        settings.tracing_otlp_insecure,
        settings.tracing_spans_file,
    )
    ACTIVE = ServerTracing(provider, settings.tracing_sample_ratio)
    logger.info(
        "tracing on: spans to %s; requests without a traceparent sampled at %g",
        ", ".join(
            str(where)
            for where in (settings.tracing_otlp_endpoint, settings.tracing_spans_file)
            if where is not None
        ),
        settings.tracing_sample_ratio,
    )
    return ACTIVE


def shutdown() -> None:
    """Export what is left and turn tracing off (the server drained: no request comes)."""
    global ACTIVE
    tracing, ACTIVE = ACTIVE, None
    if tracing is not None:
        tracing.shutdown()
