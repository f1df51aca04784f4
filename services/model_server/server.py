"""A started model server: bind every listener, load the models, report health, drain.

``RunningServer.start`` binds every listener and returns the bound addresses (tests bind TCP
port 0 or a socket in a temporary folder), then loads the models in the background: health says
NOT_SERVING until they are loaded, and the ready file is written again with them.
``drain_and_stop`` refuses new work, answers what was accepted within the grace period and
closes the listeners. What answers on the listeners is built by ``wiring.py``; the process
around a server (signals, faults, exit codes) is ``app.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2

from udfserve.runtime.call_bound import WATCH
from udfserve.services.model_server.bound_addresses import BoundAddresses, write_ready_file
from udfserve.services.model_server.config import ServerConfig, is_loopback
from udfserve.services.model_server.core.in_flight import InFlightRequests
from udfserve.services.model_server.core.model_control import ModelControl
from udfserve.services.model_server.core.model_table import ModelTable
from udfserve.services.model_server.core.request_lifecycle import RequestLifecycle
from udfserve.services.model_server.core.shares import ApplicationShares
from udfserve.services.model_server.event_loop import running_loop_kind
from udfserve.services.model_server.frontends.admin_server import AdminThread
from udfserve.services.model_server.frontends.kserve.frontend_choice import log_kserve_frontend
from udfserve.services.model_server.frontends.kserve_http.listener import (
    KServeHttpPort,
    open_kserve_http_port,
)
from udfserve.services.model_server.observability.gpu_metrics import GpuCollector
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.security import grpc_server_credentials
from udfserve.services.model_server.unix_socket import listen_on_unix_socket
from udfserve.services.model_server.wiring import build_grpc_frontends, open_admin_app

logger = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def shared_memory_folder(configured: Path | None) -> Path | None:
    """The folder clients may put payloads in, resolved; None (inline payloads only) when it is
    turned off or is not a folder here."""
    if configured is None:
        return None
    if not configured.is_dir():
        logger.warning(
            "shared memory off: --shared-memory-dir %s is not a folder here; payloads travel inline",
            configured,
        )
        return None
    return configured.resolve()


class RunningServer:
    """A started server: its listeners, its models and the tasks that serve them."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.event_loop = running_loop_kind()
        self.metrics = ServerMetrics(
            config.device,
            config.device_uuid,
            config.max_tracked_apps,
            config.slow_request_s,
            event_loop=self.event_loop,
        )
        self.metrics.register([GpuCollector(config.device, config.device_uuid)])
        self.models = ModelTable(config, self.metrics)
        self.control = ModelControl(self.models)
        self.health = health.aio.HealthServicer()
        self.in_flight = InFlightRequests()
        shares = ApplicationShares(
            config.application_scheduling,
            config.class_weights,
            config.default_priority_class,
            self.metrics.applications.observe_queue_wait,
        )
        self.requests = RequestLifecycle(
            self.models,
            self.metrics,
            self.in_flight,
            config.max_message_bytes,
            shares,
            config.room_wait_s,
            config.room_wait_calls,
        )
        shared_memory = shared_memory_folder(config.shared_memory_dir)
        self.auth_token = config.resolve_auth_token()
        frontends = build_grpc_frontends(
            config, self.requests, self.control, self.metrics, self.health, shared_memory, self.auth_token
        )
        self.grpc_server = frontends.server
        self.servicer = frontends.servicer
        self.kserve_servicer = frontends.kserve_servicer
        self.kserve_native = frontends.kserve_native
        self.kserve_choice = frontends.kserve_choice
        self.addresses: BoundAddresses | None = None
        self._admin: AdminThread | None = None
        self._kserve_http: KServeHttpPort | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None

    async def start(self) -> BoundAddresses:
        config = self.config
        self.control.scan_initial()
        self.models.on_state_change = self._publish_model_health
        await self.health.set("", NOT_SERVING)
        for name in self.models.names():
            await self.health.set(name, NOT_SERVING)

        unix_socket = tcp_address = http_address = None
        if config.socket is not None:
            # local only: the socket's file mode protects it, from the moment it appears
            listen_on_unix_socket(config.socket, int(config.socket_mode, 8), self._bind, "--socket")
            unix_socket = str(config.socket)
        if config.port is not None:
            port = self._bind(f"{config.host}:{config.port}", grpc_server_credentials(config))
            tcp_address = f"{config.host}:{port}"
        kserve_address = kserve_socket = None
        if self.kserve_choice.fallback:  # auto without the module: the python front end takes its listeners
            if config.kserve_port is not None:
                port = self._bind(f"{config.host}:{config.kserve_port}", grpc_server_credentials(config))
                kserve_address = f"{config.host}:{port}"
            if config.kserve_socket is not None:
                mode = int(config.socket_mode, 8)
                listen_on_unix_socket(config.kserve_socket, mode, self._bind, "--kserve-socket")
                kserve_socket = str(config.kserve_socket)
        await self.grpc_server.start()
        if self.kserve_native is not None:
            native_port = self.kserve_native.start()
            kserve_address = None if native_port is None else f"{config.host}:{native_port}"
            kserve_socket = None if config.kserve_socket is None else str(config.kserve_socket)

        if config.http_port is not None:
            self._admin, http_address = open_admin_app(config, self.models, self.metrics, self.auth_token)
            self._admin.start()
        self._kserve_http = open_kserve_http_port(
            config, self.kserve_servicer, self.metrics.registry, self.auth_token
        )
        if self._kserve_http is not None:
            self._kserve_http.start()

        self.addresses = BoundAddresses(
            pid=os.getpid(),
            device=config.device,
            unix_socket=unix_socket,
            tcp_address=tcp_address,
            http_address=http_address,
            kserve_address=kserve_address,
            kserve_socket=kserve_socket,
            kserve_http_address=self._kserve_http.address if self._kserve_http else None,
            kserve_frontend=self.kserve_choice.frontend,
        )
        if config.ready_file is not None:
            write_ready_file(config.ready_file, self.addresses)
        logger.info(
            "listening on %s (device %s, %s event loop)",
            ", ".join(
                a
                for a in (
                    unix_socket,
                    tcp_address,
                    http_address and f"http://{http_address}",
                    kserve_address and f"{kserve_address} (KServe, {self.kserve_choice.frontend})",
                    kserve_socket and f"{kserve_socket} (KServe, {self.kserve_choice.frontend})",
                    self._kserve_http and f"http://{self._kserve_http.address} (KServe)",
                )
                if a
            ),
            config.device,
            self.event_loop,
        )
        kserve_listeners = " and ".join(
            a for a in (kserve_address, kserve_socket and f"unix:{kserve_socket}") if a
        )
        log_kserve_frontend(self.kserve_choice, kserve_listeners or None)
        self._load_task = asyncio.create_task(self._load_models())
        return self.addresses

    def _bind(self, target: str, credentials: grpc.ServerCredentials | None = None) -> int:
        if credentials is None and not target.startswith("unix:"):
            host = target.rsplit(":", 1)[0]
            if not is_loopback(host):
                logger.warning("plaintext gRPC listener on %s: allowed by --allow-insecure-remote", target)
        try:
            if credentials is None:
                port = self.grpc_server.add_insecure_port(target)
            else:
                port = self.grpc_server.add_secure_port(target, credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {target}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot listen on {target}: the address is taken or not allowed")
        return port

    async def _load_models(self) -> None:
        try:
            await self.control.load_initial()
        except Exception as exc:  # a fault of ours (a load's own failure fails only its version)
            logger.exception("loading the models at start failed")
            self.models.report_fault(f"loading the models at start failed: {type(exc).__name__}: {exc}")
            return
        not_serving = self.models.not_serving_reason()
        if not_serving and self.config.model_control == "none":
            logger.warning("serving no model, so never ready until restarted: %s", not_serving)
        elif not_serving:
            logger.warning(
                "serving no model until one loads (--model-control %s): %s",
                self.config.model_control,
                not_serving,
            )
        self._write_ready_file()
        if not not_serving:
            await self.health.set("", SERVING)
        if self.config.model_control == "poll":
            self._poll_task = asyncio.create_task(self.control.poll_forever())
        if self.config.version_lease_s:
            self._lease_task = asyncio.create_task(self.control.leases.expire_leases_forever())

    def _write_ready_file(self) -> None:
        """The ready file with the models serving and their versions, once loading has finished."""
        if self.addresses is None or self.config.ready_file is None or not self.models.loading_done.is_set():
            return
        versions = {
            name: numbers for name, numbers in self.models.served_version_numbers().items() if numbers
        }
        not_serving = self.models.not_serving_reason()
        self.addresses = dataclasses.replace(
            self.addresses, models=tuple(versions), not_serving=not_serving, versions=versions
        )
        write_ready_file(self.config.ready_file, self.addresses)

    def _publish_model_health(self, name: str) -> None:
        """A model's versions changed: its health, and the ready file a supervisor reads."""
        status = SERVING if self.models.served_versions(name) else NOT_SERVING
        asyncio.get_running_loop().create_task(self.health.set(name, status))
        self._write_ready_file()

    async def close_listeners(self) -> None:
        """After a start that failed: let go of what was bound. Nothing was accepted yet."""
        if self.kserve_native is not None:
            with contextlib.suppress(Exception):
                await self.kserve_native.stop(0.0)
        await self.grpc_server.stop(None)

    async def drain_and_stop(self) -> None:
        """Refuse new work, answer what was accepted within the grace period, close listeners."""
        deadline = time.monotonic() + self.config.grace_period_s
        self.models.draining = True
        await self.health.enter_graceful_shutdown()
        logger.info("draining: answering accepted requests for up to %.1f s", self.config.grace_period_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.in_flight.wait_idle(), timeout=self.config.grace_period_s)
        if self.kserve_native is not None:
            await self.kserve_native.stop(max(0.0, deadline - time.monotonic()))
        if self._kserve_http is not None:
            await self._kserve_http.stop(max(0.0, deadline - time.monotonic()))
        await self.grpc_server.stop(grace=max(0.0, deadline - time.monotonic()))
        await self.models.stop(max(0.0, deadline - time.monotonic()))
        stopped = WATCH.stop_all()  # answered already: what still runs would only hold the exit
        if stopped:
            logger.warning("stopped %d model call(s) still running after the grace period", stopped)
        for task in (self._load_task, self._poll_task, self._lease_task):
            if task is not None and not task.done():
                task.cancel()
        if self._admin is not None:
            await self._admin.stop()
        for socket_path in (self.config.socket, self.config.kserve_socket):
            if socket_path is not None:
                socket_path.unlink(missing_ok=True)
        if self.config.ready_file is not None:
            self.config.ready_file.unlink(missing_ok=True)
        logger.info("stopped")
