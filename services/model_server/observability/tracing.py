"""Whether this server traces requests with OpenTelemetry, and its settings: off unless configured.

Tracing is on when spans have somewhere to go: an OTLP collector (``UDFSERVE_TRACING_OTLP_ENDPOINT``)
or a file of JSON lines (``UDFSERVE_TRACING_SPANS_FILE``). Then ``ACTIVE`` holds the process's
``spans.ServerTracing``, and the request path records, for each sampled request, spans for its
admission, its wait in the queue, the merged batch it ran in (linked to every traced request it
merged) with the device call, and its answer. Off, ``ACTIVE`` is None: the request path tests it
once per request and once per batch, makes no span object, and nothing of OpenTelemetry is
imported (the SDK and the OTLP exporter come with the ``tracing`` extra).

Which requests are traced: one whose stream came with a W3C ``traceparent`` (the Spark client's
``trace_sample_ratio`` or ``traceparent``) when its sampled flag is set, as W3C asks; one without,
with the probability ``UDFSERVE_TRACING_SAMPLE_RATIO``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from udfserve.services.model_server.observability.spans import ServerTracing

logger = logging.getLogger(__name__)

ACTIVE: ServerTracing | None = None
"""The process's tracing while it is on; None when off (the request path's one test)."""


class TracingSettings(BaseSettings):
    """The server's tracing settings, read from ``UDFSERVE_TRACING_*`` once at start."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_TRACING_", frozen=True, extra="ignore")

    otlp_endpoint: str | None = Field(
        default=None,
        description="the OTLP/gRPC collector spans are exported to, such as 'http://collector:4317'",
    )
    otlp_insecure: bool = Field(
        default=True, description="talk to the collector without TLS (a collector on the node or the pod)"
    )
    spans_file: Path | None = Field(
        default=None, description="a file each finished span is appended to, one JSON object a line"
    )
    sample_ratio: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of the requests that come without a traceparent that are traced",
    )
    service_name: str = Field(default="udfserve-model-server", min_length=1)

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None or self.spans_file is not None


def install(settings: TracingSettings, device: str) -> ServerTracing | None:
    """Turn tracing on for this process when ``settings`` give spans somewhere to go; None when
    off. Raises ``RuntimeError`` naming the extra when the OpenTelemetry SDK is not installed."""
    global ACTIVE
    if not settings.enabled:
        ACTIVE = None
        return None
    try:
        from udfserve.services.model_server.observability.trace_export import tracer_provider
    except ImportError as exc:
        raise RuntimeError(
            f"tracing is configured (UDFSERVE_TRACING_*) but the OpenTelemetry SDK is missing ({exc}); "
            "expected it installed: pip install 'udfserve[tracing]'"
        ) from exc
    from udfserve.services.model_server.observability.spans import ServerTracing

    provider = tracer_provider(
        settings.service_name, device, settings.otlp_endpoint, settings.otlp_insecure, settings.spans_file
    )
    ACTIVE = ServerTracing(provider, settings.sample_ratio)
    logger.info(
        "tracing on: spans to %s; requests without a traceparent sampled at %g",
        ", ".join(str(where) for where in (settings.otlp_endpoint, settings.spans_file) if where is not None),
        settings.sample_ratio,
    )
    return ACTIVE


def shutdown() -> None:
    """Export what is left and turn tracing off (the server drained: no request comes)."""
    global ACTIVE
    tracing, ACTIVE = ACTIVE, None
    if tracing is not None:
        tracing.shutdown()
