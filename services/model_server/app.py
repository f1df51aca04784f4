"""Lifecycle of one model server process: listen, load every model once, serve, drain.

``RunningServer.start`` binds every listener and returns the bound addresses (tests bind TCP
port 0 or a socket in a temporary folder); ``serve`` runs a started server until SIGTERM or SIGINT,
then stops accepting, answers every accepted request within the grace period and returns 0;
whatever still runs then, the process ends within ``--exit-timeout-s`` more (``exit_deadline``).
It drains the same way, and returns 0, when the process that started it dies (``--lifeline-fd``,
``lifeline.py``), and returns ``EXIT_UNRECOVERABLE`` after draining when a fault leaves it unable
to serve (a model's batcher broke for good): health turns NOT_SERVING at once, and a supervisor
restarts the process, the only way to serve that model again.
The device must be pinned (``device.pin_device``) before this module loads a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.runtime.call_bound import WATCH
from udfserve.services.model_server.config import ServerConfig, is_loopback
from udfserve.services.model_server.core.in_flight import InFlightRequests
from udfserve.services.model_server.core.memory_trim import MemoryTrimmer
from udfserve.services.model_server.core.model_control import ModelControl
from udfserve.services.model_server.core.model_table import ModelTable
from udfserve.services.model_server.core.request_lifecycle import RequestLifecycle
from udfserve.services.model_server.core.shares import ApplicationShares
from udfserve.services.model_server.event_loop import running_loop_kind
from udfserve.services.model_server.exit_deadline import EXIT_FORCED, ExitDeadline
from udfserve.services.model_server.frontends.admin_server import AdminThread, ServingLoop
from udfserve.services.model_server.frontends.arrow.grpc_api import InferenceServicer
from udfserve.services.model_server.frontends.http_api import AdminLimits, create_admin_app
from udfserve.services.model_server.frontends.kserve.metadata import server_extensions
from udfserve.services.model_server.frontends.kserve.native_bridge import (
    NativeBoundsCollector,
    NativeKServeFrontend,
)
from udfserve.services.model_server.frontends.kserve.servicer import add_kserve_service
from udfserve.services.model_server.frontends.kserve.unary_budget import UnaryAdmission, UnaryBudget
from udfserve.services.model_server.frontends.kserve_http.listener import (
    KServeHttpPort,
    answer_at_once,
    open_kserve_http_port,
    uvicorn_tls,
)
from udfserve.services.model_server.frontends.readable_requests import add_service
from udfserve.services.model_server.frontends.streaming import STREAM_METHODS, RawStreamRequests, StreamBounds
from udfserve.services.model_server.lifeline import watch_lifeline
from udfserve.services.model_server.observability import tracing as server_tracing
from udfserve.services.model_server.observability.gpu_metrics import GpuCollector
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.security import TokenInterceptor, grpc_server_credentials
from udfserve.services.model_server.unix_socket import bind_private_unix_socket
from udfserve.services.process_setup import stop_on_signals

logger = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
EXIT_UNRECOVERABLE = 70
"""The exit code after an unrecoverable fault (sysexits' EX_SOFTWARE): restart the process."""


@dataclass(frozen=True)
class BoundAddresses:
    """Where a started server listens; written to ``--ready-file`` for supervisors and tests."""

    pid: int
    device: str
    unix_socket: str | None
    tcp_address: str | None
    http_address: str | None
    kserve_address: str | None = None
    """The native KServe front end's host:port; None when KServe is served on the main listeners."""
    kserve_http_address: str | None = None
    """The KServe HTTP port's host:port (``--kserve-http-port``); None when it is off."""
    models: tuple[str, ...] = ()
    """The models that loaded: the file is written again, with them, once loading has finished
    and before health reports SERVING, so a supervisor needs no call (nor the token) to know."""
    not_serving: str = ""
    """Written with the models once loading has finished, when none serves: why (the repository
    holds no servable model, or none loaded). Such a server stays up, NOT_SERVING, and a
    supervisor reads here that waiting for it is in vain."""
    versions: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Each model's versions serving, written with the models and again whenever they change
    (``--model-control poll|explicit``): what a supervisor publishes for its node."""


def _socket_answers(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` (a stale one refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


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
            self.models, self.metrics, self.in_flight, config.max_message_bytes, shares, config.room_wait_s
        )
        stream_bounds = StreamBounds(config.max_stream_held_requests, config.max_stream_held_bytes)
        self.servicer = InferenceServicer(
            self.requests,
            self.control,
            shared_memory_folder(config.shared_memory_dir),
            frozenset(config.shared_memory_uids),
            stream_bounds,
            max_region_bytes=config.shared_memory_max_request_bytes,
        )
        options = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", 0),  # two servers must never share a port silently
        ]
        self.auth_token = config.resolve_auth_token()
        # the token is checked first (the outermost interceptor), before any message is read
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if self.auth_token:
            interceptors.append(TokenInterceptor(self.auth_token))
        unary_budget = UnaryBudget(
            config.max_unary_held_bytes,
            config.max_message_bytes,
            self.metrics,
            MemoryTrimmer(config.trim_after_call_bytes),
        )
        interceptors += [UnaryAdmission(unary_budget), RawStreamRequests()]
        self.grpc_server = grpc.aio.server(
            options=options, interceptors=interceptors, maximum_concurrent_rpcs=config.max_concurrent_calls
        )
        add_service(pb_grpc.add_InferenceServicer_to_server, self.servicer, self.grpc_server, STREAM_METHODS)
        self.kserve_servicer = add_kserve_service(
            self.grpc_server,
            self.requests,
            stream_bounds,
            self.control,
            server_extensions(http=config.kserve_http_port is not None),
        )
        self.kserve_native: NativeKServeFrontend | None = None
        if config.kserve_frontend == "native":
            self.kserve_native = NativeKServeFrontend(
                self.kserve_servicer,
                f"{config.host}:{config.kserve_port}",
                config.max_message_bytes,
                self.auth_token,
                *_tls_pem(config),
                max_concurrent_calls=config.max_concurrent_calls,
                max_held_bytes=config.max_unary_held_bytes,
                trim_after_call_bytes=config.trim_after_call_bytes,
            )
            self.metrics.register([NativeBoundsCollector(self.kserve_native)])
        add_service(health_pb2_grpc.add_HealthServicer_to_server, self.health, self.grpc_server)
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
            config.socket.parent.mkdir(parents=True, exist_ok=True)
            if config.socket.is_socket():
                if _socket_answers(config.socket):
                    raise OSError(
                        f"cannot listen on unix socket {config.socket}: another process is listening on it "
                        "(a server still running); stop it, or give this server another --socket"
                    )
                config.socket.unlink()  # a stale socket of a previous run of this server
            # local only: the socket's file mode protects it, from the moment it appears
            bind_private_unix_socket(config.socket, int(config.socket_mode, 8), self._bind)
            unix_socket = str(config.socket)
        if config.port is not None:
            port = self._bind(f"{config.host}:{config.port}", grpc_server_credentials(config))
            tcp_address = f"{config.host}:{port}"
        await self.grpc_server.start()
        kserve_address = None
        if self.kserve_native is not None:
            kserve_address = f"{config.host}:{self.kserve_native.start()}"

        if config.http_port is not None:
            try:
                http_socket = socket.create_server((config.http_host, config.http_port), reuse_port=False)
            except OSError as exc:
                raise OSError(
                    f"cannot listen on --http-host {config.http_host} --http-port {config.http_port}: "
                    f"{exc.strerror or exc}"
                ) from None
            answer_at_once(http_socket)
            http_address = f"{config.http_host}:{http_socket.getsockname()[1]}"
            app = create_admin_app(
                self.models,
                self.metrics,
                config.device,
                ServingLoop(asyncio.get_running_loop()),
                self.auth_token,
                AdminLimits(
                    requests_per_client_per_s=config.admin_requests_per_s,
                    total_requests_per_s=config.admin_total_requests_per_s,
                    metrics_min_interval_s=config.metrics_min_interval_s,
                ),
                docs=config.http_docs,
            )
            self._admin = AdminThread(app, http_socket, uvicorn_tls(config))
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
            kserve_http_address=self._kserve_http.address if self._kserve_http else None,
        )
        if config.ready_file is not None:
            _write_json_atomically(config.ready_file, asdict(self.addresses))
        logger.info(
            "listening on %s (device %s, %s event loop)",
            ", ".join(
                a
                for a in (
                    unix_socket,
                    tcp_address,
                    http_address and f"http://{http_address}",
                    kserve_address and f"{kserve_address} (KServe, native)",
                    self._kserve_http and f"http://{self._kserve_http.address} (KServe)",
                )
                if a
            ),
            config.device,
            self.event_loop,
        )
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
        _write_json_atomically(self.config.ready_file, asdict(self.addresses))

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
        if self.config.socket is not None:
            self.config.socket.unlink(missing_ok=True)
        if self.config.ready_file is not None:
            self.config.ready_file.unlink(missing_ok=True)
        logger.info("stopped")


def _tls_pem(config: ServerConfig) -> tuple[bytes, bytes, bytes]:
    """The TLS key, certificate chain and client CA as PEM (empty when not configured)."""

    def read(path: Path | None) -> bytes:
        return path.read_bytes() if path is not None else b""

    return read(config.tls_key_file), read(config.tls_cert_file), read(config.tls_client_ca_file)


def _write_json_atomically(path: Path, payload: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)


async def serve(config: ServerConfig) -> int:
    """Run one model server until SIGTERM/SIGINT; return the process exit code."""
    prometheus_client.disable_created_metrics()
    server = RunningServer(config)
    stop = asyncio.Event()
    deadline = ExitDeadline()

    def stopping(code: int = EXIT_FORCED) -> None:
        stop.set()
        deadline.arm(config.grace_period_s + config.exit_timeout_s, code)

    def on_signal(signum: int) -> None:
        logger.info("received %s", signal.Signals(signum).name)
        stopping()

    def on_fault(reason: str) -> None:
        logger.error(
            "unrecoverable fault: %s; draining, then exiting with code %d for a fresh process to serve",
            reason,
            EXIT_UNRECOVERABLE,
        )
        stopping(EXIT_UNRECOVERABLE)

    def on_parent_gone() -> None:
        logger.warning("the process that started this server is gone (--lifeline-fd closed); draining")
        stopping()

    server.models.on_fault = on_fault
    server_tracing.install(server_tracing.TracingSettings(), config.device)
    with stop_on_signals(on_signal):
        try:
            if config.lifeline_fd is not None:
                watch_lifeline(config.lifeline_fd, on_parent_gone)
            await server.start()
        except OSError as exc:  # an address or socket this server cannot take: the message says which
            logger.error("refusing to start: %s", exc)
            await server.close_listeners()
            return 2
        await stop.wait()
        await server.drain_and_stop()
        server_tracing.shutdown()
    return EXIT_UNRECOVERABLE if server.models.fault else 0
