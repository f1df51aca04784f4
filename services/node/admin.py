"""The supervisor's own small HTTP surface: ``/metrics`` (gzip-compressed for a scraper that
accepts it), ``/health/live``, ``/health/ready``.

A standard-library HTTP server on a thread: the supervisor imports neither TensorFlow nor a
web framework, so it starts in a fraction of a second and stays small. It exports only what
the supervisor knows (restarts, which servers are ready, when it last wrote the discovery file);
each server exports its own figures, and the rows the Spark clients' CPU fallback answered on
the node come from the clients' reports (``fallback_metrics.py``).
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import gzip_accepted

from udfserve.services.node.fallback_metrics import FallbackRows

logger = logging.getLogger(__name__)


class SupervisorMetrics:
    """Metrics of the supervisor process, in a registry of their own."""

    def __init__(
        self,
        devices: list[str],
        discovery_stale_after_s: float | None = None,
        fallback_reports_dir: Path | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if fallback_reports_dir is not None:
            self.registry.register(FallbackRows(fallback_reports_dir))
        self.restarts = Counter(
            "udfserve_server_restarts",
            "Model servers started again after they exited or failed to start, by device.",
            ["device"],
            registry=self.registry,
        )
        self.server_ready = Gauge(
            "udfserve_server_ready",
            "1 while the device's model server is ready and listed in the discovery file.",
            ["device"],
            registry=self.registry,
        )
        self.discovery_written = Gauge(
            "udfserve_discovery_last_write_timestamp_seconds",
            "Unix time the supervisor last wrote the discovery file (its updated_at): it is rewritten "
            "every --discovery-heartbeat-s, so an age past udfserve_discovery_stale_after_seconds means "
            "its event loop is stuck, and the Spark clients take the file for absent.",
            registry=self.registry,
        )
        self.discovery_stale_after = Gauge(
            "udfserve_discovery_stale_after_seconds",
            "Age past which the Spark clients take the discovery file for absent "
            "(--discovery-stale-after-s).",
            registry=self.registry,
        )
        if discovery_stale_after_s is not None:
            self.discovery_stale_after.set(discovery_stale_after_s)
        for device in devices:
            # Present from the start, so a rate() over restarts has a zero to begin from.
            self.restarts.labels(device=device)
            self.server_ready.labels(device=device).set(0)


Health = Callable[[], tuple[bool, dict[str, object]]]


class AdminAddressUnavailable(OSError):
    """The supervisor's HTTP address cannot be bound; the message names the setting."""


class AdminServer:
    """Serves the supervisor's metrics and health on ``host:port`` from a daemon thread."""

    def __init__(self, host: str, port: int, metrics: SupervisorMetrics, health: Health) -> None:
        handler = _handler_class(metrics.registry, health)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise AdminAddressUnavailable(
                f"cannot serve the supervisor's metrics and health on {host}:{port} ({exc.strerror}); "
                "expected a free address: set --supervisor-http-port (UDFSERVE_SUPERVISOR_HTTP_PORT) to "
                "another port, or 0 for any free one"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="supervisor-http", daemon=True
        )

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler_class(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, headers = generate_latest(registry), {"Vary": "Accept-Encoding"}
                if gzip_accepted(self.headers.get("Accept-Encoding", "")):
                    body, headers["Content-Encoding"] = gzip.compress(body, mtime=0), "gzip"
                self._reply(200, body, CONTENT_TYPE_LATEST, headers)
            elif self.path == "/health/live":
                self._reply_json(200, {"status": "alive"})
            elif self.path == "/health/ready":
                ready, detail = health()
                self._reply_json(200 if ready else 503, {"ready": ready, **detail})
            else:
                self._reply_json(404, {"error": f"no such path {self.path}; try /metrics or /health/ready"})

        def _reply_json(self, status: int, body: dict[str, object]) -> None:
            self._reply(status, json.dumps(body).encode(), "application/json")

        def _reply(
            self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("http %s", format % args)

    return Handler
