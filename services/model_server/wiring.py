"""What answers on a model server's listeners: the gRPC server with its interceptors and services
(the Arrow Predict stream, KServe v2, health), the native KServe front end, and the admin app.

``RunningServer`` (``server.py``) builds the core every front end shares (the model table, the
request lifecycle) and hands it here; what is built here only answers requests, and the server's
lifecycle binds, starts and stops it.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.core.memory_trim import MemoryTrimmer
from udfserve.services.model_server.core.model_control import ModelControl
from udfserve.services.model_server.core.model_table import ModelTable
from udfserve.services.model_server.core.request_lifecycle import RequestLifecycle
from udfserve.services.model_server.frontends.admin_server import AdminThread, ServingLoop
from udfserve.services.model_server.frontends.arrow.grpc_api import InferenceServicer
from udfserve.services.model_server.frontends.http_api import AdminLimits, create_admin_app
from udfserve.services.model_server.frontends.kserve.frontend_choice import (
    KServeFrontendChoice,
    choose_kserve_frontend,
)
from udfserve.services.model_server.frontends.kserve.metadata import server_extensions
from udfserve.services.model_server.frontends.kserve.native_bridge import (
    NativeBoundsCollector,
    NativeKServeFrontend,
)
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer, add_kserve_service
from udfserve.services.model_server.frontends.kserve.system_shared_memory import (
    RegionBounds,
    SystemSharedMemory,
)
from udfserve.services.model_server.frontends.kserve.unary_budget import UnaryAdmission, UnaryBudget
from udfserve.services.model_server.frontends.kserve_http.listener import answer_at_once, uvicorn_tls
from udfserve.services.model_server.frontends.readable_requests import add_service
from udfserve.services.model_server.frontends.streaming import STREAM_METHODS, RawStreamRequests, StreamBounds
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.security import TokenInterceptor


@dataclass(frozen=True)
class GrpcFrontends:
    """The gRPC server with every service added, not yet bound, and the front ends it serves."""

    server: grpc.aio.Server
    servicer: InferenceServicer
    kserve_servicer: KServeServicer
    kserve_native: NativeKServeFrontend | None
    """The native KServe front end (``--kserve-frontend native``, or ``auto`` where it loads), on a
    port of its own."""
    kserve_choice: KServeFrontendChoice
    """Which KServe front end serves, and why; on ``auto``'s fallback the gRPC server above also
    listens on ``--kserve-port``."""


def build_grpc_frontends(
    config: ServerConfig,
    requests: RequestLifecycle,
    control: ModelControl,
    metrics: ServerMetrics,
    health_servicer: health.aio.HealthServicer,
    shared_memory: Path | None,
    auth_token: str | None,
) -> GrpcFrontends:
    """The gRPC server of ``config``'s bounds: the token checked first (the outermost interceptor),
    before any message is read, then the unary budget; the Arrow and KServe services on
    ``requests``, and the health service."""
    stream_bounds = StreamBounds(config.max_stream_held_requests, config.max_stream_held_bytes)
    servicer = InferenceServicer(
        requests,
        control,
        shared_memory,
        frozenset(config.shared_memory_uids),
        stream_bounds,
        max_region_bytes=config.shared_memory_max_request_bytes,
    )
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),  # two servers must never share a port silently
    ]
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if auth_token:
        interceptors.append(TokenInterceptor(auth_token))
    unary_budget = UnaryBudget(
        config.max_unary_held_bytes,
        config.max_message_bytes,
        metrics,
        MemoryTrimmer(config.trim_after_call_bytes),
    )
    interceptors += [UnaryAdmission(unary_budget), RawStreamRequests()]
    server = grpc.aio.server(
        options=options, interceptors=interceptors, maximum_concurrent_rpcs=config.max_concurrent_calls
    )
    add_service(pb_grpc.add_InferenceServicer_to_server, servicer, server, STREAM_METHODS)
    regions = _system_shared_memory(config, shared_memory)
    kserve_servicer = add_kserve_service(
        server,
        requests,
        stream_bounds,
        control,
        server_extensions(http=config.kserve_http_port is not None, system_shared_memory=regions is not None),
        regions,
    )
    kserve_choice = choose_kserve_frontend(config.kserve_frontend, config.kserve_port, config.kserve_socket)
    kserve_native: NativeKServeFrontend | None = None
    if kserve_choice.frontend == "native":
        kserve_native = NativeKServeFrontend(
            kserve_servicer,
            None if config.kserve_port is None else f"{config.host}:{config.kserve_port}",
            config.max_message_bytes,
            auth_token,
            *_tls_pem(config),
            max_concurrent_calls=config.max_concurrent_calls,
            max_held_bytes=config.max_unary_held_bytes,
            trim_after_call_bytes=config.trim_after_call_bytes,
            socket=config.kserve_socket,
            socket_mode=int(config.socket_mode, 8),
        )
        metrics.register([NativeBoundsCollector(kserve_native)])
    add_service(health_pb2_grpc.add_HealthServicer_to_server, health_servicer, server)
    return GrpcFrontends(server, servicer, kserve_servicer, kserve_native, kserve_choice)


def _system_shared_memory(config: ServerConfig, folder: Path | None) -> SystemSharedMemory | None:
    """The KServe system shared-memory regions, in the shared-memory ``folder`` (resolved); None when
    it is off."""
    if folder is None:
        return None
    bounds = RegionBounds(
        max_regions=config.kserve_shared_memory_max_regions,
        max_bytes=config.kserve_shared_memory_max_bytes,
        max_regions_per_client=config.kserve_shared_memory_max_regions_per_client,
        max_bytes_per_client=config.kserve_shared_memory_max_bytes_per_client,
        max_request_bytes=config.shared_memory_max_request_bytes,
    )
    return SystemSharedMemory(folder, bounds, frozenset(config.shared_memory_uids))


def open_admin_app(
    config: ServerConfig, models: ModelTable, metrics: ServerMetrics, auth_token: str | None
) -> tuple[AdminThread, str]:
    """The admin app listening on ``--http-host`` and ``--http-port``, not yet started, and its
    host:port; ``OSError`` naming the address when it cannot be had. Called on the serving loop,
    which the app reads the model table on."""
    assert config.http_port is not None
    try:
        http_socket = socket.create_server((config.http_host, config.http_port), reuse_port=False)
    except OSError as exc:
        raise OSError(
            f"cannot listen on --http-host {config.http_host} --http-port {config.http_port}: "
            f"{exc.strerror or exc}"
        ) from None
    answer_at_once(http_socket)
    address = f"{config.http_host}:{http_socket.getsockname()[1]}"
    app = create_admin_app(
        models,
        metrics,
        config.device,
        ServingLoop(asyncio.get_running_loop()),
        auth_token,
        AdminLimits(
            requests_per_client_per_s=config.admin_requests_per_s,
            total_requests_per_s=config.admin_total_requests_per_s,
            metrics_min_interval_s=config.metrics_min_interval_s,
        ),
        docs=config.http_docs,
    )
    return AdminThread(app, http_socket, uvicorn_tls(config)), address


def _tls_pem(config: ServerConfig) -> tuple[bytes, bytes, bytes]:
    """The TLS key, certificate chain and client CA as PEM (empty when not configured)."""

    def read(path: Path | None) -> bytes:
        return path.read_bytes() if path is not None else b""

    return read(config.tls_key_file), read(config.tls_cert_file), read(config.tls_client_ca_file)
