"""The system shared-memory routes of the KServe v2 protocol over HTTP, as Triton serves them:

- ``GET /v2/systemsharedmemory[/region/{region}]/status``: a JSON list of ``{"name", "key",
  "offset", "byte_size"}``, every region's or the one named (404 for an unknown one);
- ``POST /v2/systemsharedmemory/region/{region}/register`` with ``{"key", "offset", "byte_size"}``;
- ``POST /v2/systemsharedmemory[/region/{region}]/unregister``: every region, or the one named.

They call what the gRPC calls do (``kserve.shared_memory_calls``), on the serving loop, so both
protocols share one table of regions, its bounds and its words; a client is its address, as
``ipv4:<host>`` or ``ipv6:<host>`` as gRPC names its peers, so that one client's regions count
against its bound through either protocol. The port's token and bounds guard these routes as
every other (``bounds.PortBounds.guard``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.services.model_server.frontends.kserve import shared_memory_calls
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer
from udfserve.services.model_server.frontends.kserve_http.dispatch import ServingCalls
from udfserve.services.model_server.frontends.kserve_http.handlers import (
    Aborted,
    KServeHandlers,
    json_response,
)

KIND = "systemsharedmemory"


class SharedMemoryHandlers:
    """The routes' handlers over one servicer's regions."""

    def __init__(self, servicer: KServeServicer, serving: ServingCalls, handlers: KServeHandlers) -> None:
        self._servicer = servicer
        self._serving = serving
        self._handlers = handlers

    async def _on_serving_loop(self, call: Callable[[], Any]) -> Any:
        async def run() -> Any:
            try:
                return call()
            except ServingError as exc:
                raise Aborted(exc.code, exc.message) from None

        return await self._serving.call(run)

    async def status(self, request: Request) -> Response:
        message = kpb.SystemSharedMemoryStatusRequest(name=request.path_params.get("region", ""))
        answer = await self._on_serving_loop(
            lambda: shared_memory_calls.status(self._servicer.shared_memory, message)
        )
        regions = [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in answer.regions.values()
        ]
        return json_response(sorted(regions, key=lambda region: region["name"]))

    async def register(self, request: Request) -> Response:
        body = await self._handlers.json_body(request)
        message = kpb.SystemSharedMemoryRegisterRequest(
            name=request.path_params["region"],
            key=_field(body, "key", str),
            offset=_field(body, "offset", int, 0),
            byte_size=_field(body, "byte_size", int),
        )
        client = _client(request)
        await self._on_serving_loop(
            lambda: shared_memory_calls.register(self._servicer.shared_memory, message, client)
        )
        return Response(status_code=200)

    async def unregister(self, request: Request) -> Response:
        message = kpb.SystemSharedMemoryUnregisterRequest(name=request.path_params.get("region", ""))
        await self._on_serving_loop(
            lambda: shared_memory_calls.unregister(self._servicer.shared_memory, message)
        )
        return Response(status_code=200)


def _field(body: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = body.get(key, default)
    if value is None or not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInput(
            f"the register body's {key!r} is {clip(value, 40)}; expected a {kind.__name__} "
            "(a body of 'key', 'offset' and 'byte_size')"
        )
    if isinstance(value, int) and not 0 <= value < 1 << 64:
        raise InvalidInput(f"the register body's {key!r} is {value}; expected a uint64")
    return value


def _client(request: Request) -> str:
    host = request.client.host if request.client else "unknown"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"


def system_shared_memory_routes(handlers: SharedMemoryHandlers) -> list[Route]:
    """Triton's five system shared-memory routes, served."""
    return [
        Route(f"/v2/{KIND}/status", handlers.status, methods=["GET"]),
        Route(f"/v2/{KIND}/region/{{region}}/status", handlers.status, methods=["GET"]),
        Route(f"/v2/{KIND}/region/{{region}}/register", handlers.register, methods=["POST"]),
        Route(f"/v2/{KIND}/unregister", handlers.unregister, methods=["POST"]),
        Route(f"/v2/{KIND}/region/{{region}}/unregister", handlers.unregister, methods=["POST"]),
    ]
