"""The route table of the KServe v2 protocol over HTTP, and the port's ASGI app.

The table (``kserve_routes``) is the protocol's, Triton's extensions included. What this server
does not serve answers 501 with the reason: CUDA shared memory (but its unregister, which has
nothing to forget), trace and log settings, and Triton's generate extension; system shared
memory is served (``shared_memory``), and refused only where the server's shared-memory folder
is off. Every served route's refusals are answered as the protocol's errors (``_answering``):
``{"error": message}`` with the HTTP status of the servicer's gRPC status.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from udfserve.log_text import clip
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.admin_server import ServingLoopUnresponsive
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer
from udfserve.services.model_server.frontends.kserve.shared_memory_calls import (
    CUDA_SHARED_MEMORY_REFUSED,
    SYSTEM_SHARED_MEMORY_OFF,
)
from udfserve.services.model_server.frontends.kserve_http.bounds import HttpRefused, PortBounds
from udfserve.services.model_server.frontends.kserve_http.dispatch import ServingCalls
from udfserve.services.model_server.frontends.kserve_http.handlers import (
    Aborted,
    KServeHandlers,
    error_response,
)
from udfserve.services.model_server.frontends.kserve_http.json_views import http_status
from udfserve.services.model_server.frontends.kserve_http.shared_memory import (
    SharedMemoryHandlers,
    system_shared_memory_routes,
)

logger = logging.getLogger(__name__)

Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]


def refused(reason: str) -> Endpoint:
    """A route of the protocol this server does not serve: 501 with ``reason``."""

    async def not_served(request: Request) -> Response:
        return error_response(501, reason)

    return not_served


# -- the table ---------------------------------------------------------------------------------
CUDA_SHARED_MEMORY = CUDA_SHARED_MEMORY_REFUSED
NOT_SERVED = "{} is not served by this server (its gRPC calls answer UNIMPLEMENTED too)"


def _answering(handler: Endpoint) -> Endpoint:
    """``handler`` with its refusals answered as the protocol's errors, and a fault as 500 (logged
    once, with the path clipped)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpRefused as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except InvalidInput as exc:
            return error_response(400, exc.message)
        except Aborted as exc:
            return error_response(http_status(exc.code), exc.message)
        except ServingLoopUnresponsive as exc:
            return error_response(503, str(exc))
        except Exception as exc:
            logger.error(
                "KServe HTTP %s %s failed",
                request.method,
                clip(request.url.path),
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            return error_response(500, "the server failed to answer; see its log")

    return endpoint


def _model_paths(suffix: str) -> list[str]:
    return [f"/v2/models/{{model}}{suffix}", f"/v2/models/{{model}}/versions/{{version}}{suffix}"]


async def nothing_to_unregister(request: Request) -> Response:
    """CUDA shared memory's unregister: no CUDA region is ever registered here, so there is nothing
    to forget (200), as over gRPC (``shared_memory_calls`` says why)."""
    return Response(status_code=200)


def _shared_memory_routes(kind: str, reason: str, unregister: Endpoint | None = None) -> list[Route]:
    """Triton's register, status and unregister routes of one kind of shared memory, refused
    (unregister answered by ``unregister`` when given)."""
    not_served = refused(reason)
    forget = unregister or not_served
    return [
        Route(f"/v2/{kind}/status", not_served, methods=["GET"]),
        Route(f"/v2/{kind}/region/{{region}}/status", not_served, methods=["GET"]),
        Route(f"/v2/{kind}/region/{{region}}/register", not_served, methods=["POST"]),
        Route(f"/v2/{kind}/unregister", forget, methods=["POST"]),
        Route(f"/v2/{kind}/region/{{region}}/unregister", forget, methods=["POST"]),
    ]


def kserve_routes(handlers: KServeHandlers, shared_memory: SharedMemoryHandlers | None = None) -> list[Route]:
    """The protocol's routes, served or refused (see the module's docstring); system shared memory
    is served by ``shared_memory``, refused without it."""
    trace = refused(NOT_SERVED.format("trace settings"))
    generate = refused(
        "the generate extension is not served by this server; expected .../infer with the model's tensors"
    )
    served = [
        Route("/v2", handlers.server_metadata, methods=["GET"]),
        Route("/v2/health/live", handlers.live, methods=["GET"]),
        Route("/v2/health/ready", handlers.ready, methods=["GET"]),
        Route("/v2/models/stats", handlers.statistics, methods=["GET"]),
        *(Route(path, handlers.model_metadata, methods=["GET"]) for path in _model_paths("")),
        *(Route(path, handlers.model_ready, methods=["GET"]) for path in _model_paths("/ready")),
        *(Route(path, handlers.model_config, methods=["GET"]) for path in _model_paths("/config")),
        *(Route(path, handlers.statistics, methods=["GET"]) for path in _model_paths("/stats")),
        *(Route(path, handlers.infer, methods=["POST"]) for path in _model_paths("/infer")),
        Route("/v2/repository/index", handlers.repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", handlers.repository_load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", handlers.repository_unload, methods=["POST"]),
        *(system_shared_memory_routes(shared_memory) if shared_memory is not None else ()),
    ]
    not_served = [
        *(
            ()
            if shared_memory is not None
            else _shared_memory_routes("systemsharedmemory", SYSTEM_SHARED_MEMORY_OFF)
        ),
        *_shared_memory_routes("cudasharedmemory", CUDA_SHARED_MEMORY, nothing_to_unregister),
        Route("/v2/trace/setting", trace, methods=["GET", "POST"]),
        Route("/v2/models/{model}/trace/setting", trace, methods=["GET", "POST"]),
        Route("/v2/logging", refused(NOT_SERVED.format("log settings")), methods=["GET", "POST"]),
        *(Route(path, generate, methods=["POST"]) for path in _model_paths("/generate")),
        *(Route(path, generate, methods=["POST"]) for path in _model_paths("/generate_stream")),
    ]
    return [Route(r.path, _answering(r.endpoint), methods=r.methods) for r in served] + not_served


def kserve_app(servicer: KServeServicer, serving: ServingCalls, bounds: PortBounds) -> Any:
    """The port's ASGI app: the routes behind the port's bounds (``bounds.PortBounds.guard``)."""

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(
            404, f"no KServe v2 route {clip(request.url.path, 200)!r}; expected a /v2/... path"
        )

    async def not_allowed(request: Request, exc: Exception) -> Response:
        allow = exc.headers.get("Allow", "") if isinstance(exc, HTTPException) and exc.headers else ""
        return error_response(
            405,
            f"{request.method} is not served on {clip(request.url.path, 200)!r}; expected {allow}",
            {"Allow": allow},
        )

    handlers = KServeHandlers(servicer, serving, bounds)
    shared_memory = (
        SharedMemoryHandlers(servicer, serving, handlers) if servicer.shared_memory is not None else None
    )
    app = Starlette(
        routes=kserve_routes(handlers, shared_memory),
        exception_handlers={404: not_found, 405: not_allowed},
    )
    return bounds.guard(app)
