"""The KServe HTTP port (``--kserve-http-port``): uvicorn serving the protocol's routes, on the
serving loop or on a thread and event loop of its own (``--kserve-http-loop``, see ``dispatch``).

A port apart from the admin app's, so that inference traffic and its limits (``bounds``) never take
the admin app's connections or pace, on which probes and Prometheus rely, and the admin app's 50
requests a second never bound inference. Its TLS files are the server's, as the admin app's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from typing import Any, Literal

import uvicorn
from prometheus_client import CollectorRegistry

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.frontends.admin_server import UvicornWithoutSignals
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer
from udfserve.services.model_server.frontends.kserve_http.bounds import PortBounds
from udfserve.services.model_server.frontends.kserve_http.dispatch import FromOwnLoop, OnServingLoop
from udfserve.services.model_server.frontends.kserve_http.routes import kserve_app
from udfserve.services.model_server.frontends.lingering_http import LingeringH11Protocol

logger = logging.getLogger(__name__)

Placement = Literal["serving", "own"]

HTTP_PARSER = LingeringH11Protocol
"""uvicorn's parser of HTTP/1.1, whatever else is installed: h11 bounds a request's line and headers
(16 KiB, ``h11_max_incomplete_event_size``); uvicorn's httptools parser, which ``auto`` takes when
httptools is installed, bounds neither, so a client sending one endless header grows the process.
Its 400 for a request over that bound is followed by a lingering close (``lingering_http``), so
that the client reads the 400 rather than a connection reset."""

CONNECTIONS_PER_REQUEST = 2
"""uvicorn keeps at most this many connections per request the port handles at once (its 503,
plain text, beyond): idle keep-alive connections beyond the requests, bounded; the port's own
count of requests answers first, in JSON."""


class KServeHttpPort:
    """One server's KServe HTTP port, started on the serving loop and stopped when it drains."""

    def __init__(
        self,
        servicer: KServeServicer,
        bounds: PortBounds,
        http_socket: socket.socket,
        placement: Placement,
        tls: dict[str, object],
    ) -> None:
        self._socket = http_socket
        self._placement = placement
        serving = asyncio.get_running_loop()
        calls = OnServingLoop() if placement == "serving" else FromOwnLoop(serving)
        config = uvicorn.Config(
            kserve_app(servicer, calls, bounds),
            log_level="warning",
            log_config=None,  # uvicorn's lines go through the process's handler and its bounds
            access_log=False,
            lifespan="off",
            limit_concurrency=CONNECTIONS_PER_REQUEST * bounds.max_requests,
            http=HTTP_PARSER,
            proxy_headers=False,
            server_header=False,
            **tls,  # type: ignore[arg-type]
        )
        self._server = UvicornWithoutSignals(config)
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> None:
        if self._placement == "serving":
            self._task = asyncio.get_running_loop().create_task(self._serve())
        else:
            self._thread = threading.Thread(target=self._run, name="udfserve-kserve-http", daemon=True)
            self._thread.start()

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        except Exception:
            logger.exception("the KServe HTTP port stopped on an error; gRPC serving goes on")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def stop(self, grace_s: float) -> None:
        """Stop listening; requests being answered get ``grace_s`` to finish."""
        server: Any = self._server
        server.config.timeout_graceful_shutdown = max(1, round(grace_s))
        server.should_exit = True  # uvicorn polls it every 0.1 s
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace_s + 2.0)
            except TimeoutError:
                self._task.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, grace_s + 2.0)
            if self._thread.is_alive():
                logger.warning("the KServe HTTP port did not stop within %g s; exiting without it", grace_s)


def answer_at_once(listening: socket.socket) -> None:
    """Turn Nagle's algorithm off for the connections ``listening`` accepts (Linux hands the option
    down to them). asyncio's own loop sets it only on sockets made with proto IPPROTO_TCP, which
    ``socket.create_server``'s are not, and uvicorn writes an answer's head and body apart: on a
    keep-alive connection the body then waited for the client's delayed ACK, 40 ms an answer."""
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def uvicorn_tls(config: ServerConfig) -> dict[str, object]:
    """uvicorn's TLS settings of the server's TLS files (empty without TLS); mutual TLS with a CA."""
    if not config.tls_enabled:
        return {}
    tls: dict[str, object] = {
        "ssl_certfile": str(config.tls_cert_file),
        "ssl_keyfile": str(config.tls_key_file),
    }
    if config.tls_client_ca_file is not None:
        tls |= {"ssl_ca_certs": str(config.tls_client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return tls


def open_kserve_http_port(
    config: ServerConfig, servicer: KServeServicer, registry: CollectorRegistry, token: str | None
) -> KServeHttpPort | None:
    """The server's KServe HTTP port on ``--host`` and ``--kserve-http-port``, listening and not yet
    started; None when the port is off. ``OSError`` naming the address when it cannot be had."""
    if config.kserve_http_port is None:
        return None
    try:
        http_socket = socket.create_server((config.host, config.kserve_http_port), reuse_port=False)
    except OSError as exc:
        raise OSError(
            f"cannot listen on --host {config.host} --kserve-http-port {config.kserve_http_port}: "
            f"{exc.strerror or exc}"
        ) from None
    answer_at_once(http_socket)
    bounds = PortBounds(
        registry,
        max_requests=config.max_concurrent_calls,
        max_body_bytes=config.max_message_bytes,
        max_held_bytes=config.max_unary_held_bytes,
        token=token,
    )
    return KServeHttpPort(servicer, bounds, http_socket, config.kserve_http_loop, uvicorn_tls(config))
