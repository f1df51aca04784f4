"""What the KServe HTTP port may hold, and the reading of a request body within it.

The port applies the gRPC side's limits to its own requests, as the native gRPC port does to its
calls (each port its own count and budget, of the same sizes):

- **requests at once**: ``--max-concurrent-calls``; a request beyond is answered 503 with
  ``Retry-After`` before its body is read;
- **body size**: ``--max-message-bytes``, of the body as sent and once decompressed; a larger one
  is answered 413, before reading when its ``Content-Length`` says so;
- **held bytes**: ``--max-unary-held-bytes`` of bodies read or being read and not yet answered. A
  request is read once the budget has room for its ``Content-Length`` (for a body of unknown or
  compressed size, for the largest body) and waits unread until then, first come first served;
  one request is always read while none is held.

The token (``Authorization: Bearer``), when the server has one, is checked before any of it.
Everything here runs on the port's own event loop.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.requests import Request

from udfserve.log_text import clip
from udfserve.services.model_server.security import token_matches

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
"""Answered without the token, as the gRPC health service and the admin app's probes are."""
THREAD_FROM_BYTES = 1 << 20
"""Bodies and answers from this size are decompressed, read, written and compressed on a worker
thread instead of on the port's event loop (zlib lets go of the GIL; JSON does every 5 ms)."""


class HttpRefused(Exception):
    """A request the port refuses before its handler answers it: ``status`` and the reason."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_body(message: str) -> bytes:
    """The protocol's error answer: ``{"error": message}``."""
    return json.dumps({"error": message}).encode()


async def send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = error_body(message)
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class HttpBudget:
    """Bytes of bodies reserved for reading or read and not yet answered, at most ``limit_bytes``."""

    def __init__(self, limit_bytes: int, held: Gauge, waiting: Gauge) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._held_gauge = held
        self._waiting_gauge = waiting

    def _has_room(self, size_bytes: int) -> bool:
        return self.held_bytes == 0 or self.held_bytes + size_bytes <= self.limit_bytes

    async def reserve(self, size_bytes: int) -> None:
        """Hold ``size_bytes`` once there is room, first come first served."""
        if not self._waiting and self._has_room(size_bytes):
            self._hold(size_bytes)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((size_bytes, waiter))
        self._waiting_gauge.inc()
        try:
            await waiter  # ``_wake`` held the bytes for this request before waking it
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size_bytes)
            else:
                self._waiting = deque(item for item in self._waiting if item[1] is not waiter)
            raise
        finally:
            self._waiting_gauge.dec()

    def release(self, size_bytes: int) -> None:
        self._hold(-size_bytes)
        while self._waiting and self._has_room(self._waiting[0][0]):
            size, waiter = self._waiting.popleft()
            if not waiter.done():
                self._hold(size)
                waiter.set_result(None)

    def _hold(self, delta_bytes: int) -> None:
        self.held_bytes += delta_bytes
        self._held_gauge.set(self.held_bytes)


class PortBounds:
    """The port's limits, its metrics, and the reading of bodies within them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_requests: int,
        max_body_bytes: int,
        max_held_bytes: int,
        token: str | None = None,
    ) -> None:
        self.max_requests = max_requests
        self.max_body_bytes = max_body_bytes
        self.token = token
        self.requests = 0
        self._requests_gauge = Gauge(
            "udfserve_kserve_http_requests",
            "Requests the KServe HTTP port handles now (at most --max-concurrent-calls).",
            registry=registry,
        )
        self.refusals = Counter(
            "udfserve_kserve_http_refusals",
            "Requests the KServe HTTP port refused before reading them, by reason (token, busy, too_large).",
            ["reason"],
            registry=registry,
        )
        self.budget = HttpBudget(
            max_held_bytes,
            Gauge(
                "udfserve_kserve_http_held_bytes",
                "Bytes of KServe HTTP bodies reserved for reading or read and not yet answered (at most "
                "--max-unary-held-bytes).",
                registry=registry,
            ),
            Gauge(
                "udfserve_kserve_http_requests_waiting",
                "KServe HTTP requests waiting, unread, for room in --max-unary-held-bytes.",
                registry=registry,
            ),
        )

    def guard(self, app: AsgiApp) -> AsgiApp:
        """``app`` behind the token and the count of requests at once."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if self.token is not None and scope["path"] not in OPEN_PATHS:
                authorization = _header(scope, b"authorization")
                if not token_matches(self.token, authorization):
                    self.refusals.labels(reason="token").inc()
                    await send_error(
                        send,
                        401,
                        "missing or wrong token: send header 'Authorization: Bearer <token>'",
                        {"www-authenticate": "Bearer"},
                    )
                    return
            if self.requests >= self.max_requests:
                self.refusals.labels(reason="busy").inc()
                await send_error(
                    send,
                    503,
                    f"the server handles {self.requests} KServe HTTP requests, its most at once "
                    "(--max-concurrent-calls); retry later",
                    {"retry-after": "1"},
                )
                return
            self.requests += 1
            self._requests_gauge.set(self.requests)
            try:
                await app(scope, receive, send)
            finally:
                self.requests -= 1
                self._requests_gauge.set(self.requests)

        return guarded

    @asynccontextmanager
    async def body(self, request: Request) -> AsyncIterator[bytes]:
        """The request's body, decompressed, held in the budget until the block ends; raises
        ``HttpRefused`` (413 too large, 400 unreadable)."""
        declared = request.headers.get("content-length")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "deflate"):
            raise HttpRefused(
                415,
                f"Content-Encoding {clip(encoding, 40)!r} is not one this server reads; expected gzip, "
                "deflate or none",
            )
        size_bytes = self.max_body_bytes
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_body_bytes:
                self.refusals.labels(reason="too_large").inc()
                raise HttpRefused(413, self._too_large(f"a body of {declared} bytes"))
            if encoding == "identity":
                size_bytes = int(declared)
        await self.budget.reserve(size_bytes)
        try:
            body = await self._read(request)
            if encoding != "identity":
                body = await self._decompress(body, encoding)
            yield body
        finally:
            self.budget.release(size_bytes)

    async def _read(self, request: Request) -> bytes:
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                self.refusals.labels(reason="too_large").inc()
                raise HttpRefused(413, self._too_large(f"a body of more than {size} bytes"))
            chunks.append(chunk)
        return b"".join(chunks)

    async def _decompress(self, body: bytes, encoding: str) -> bytes:
        limit = self.max_body_bytes

        def inflate() -> bytes:
            inflater = zlib.decompressobj(wbits=47)  # zlib or gzip, by the header
            try:
                data = inflater.decompress(body, limit + 1)
            except zlib.error as exc:
                raise HttpRefused(
                    400, f"the body is not {encoding} data ({exc}); expected it as its Content-Encoding says"
                ) from None
            if len(data) > limit or inflater.unconsumed_tail:
                self.refusals.labels(reason="too_large").inc()
                raise HttpRefused(
                    413, self._too_large(f"a body of more than {limit} bytes once decompressed")
                )
            if not inflater.eof:
                raise HttpRefused(400, f"the {encoding} body ends before its data does; expected it whole")
            return data

        if len(body) >= THREAD_FROM_BYTES:
            return await asyncio.to_thread(inflate)
        return inflate()

    def _too_large(self, what: str) -> str:
        return (
            f"{what} is over this server's limit of {self.max_body_bytes} bytes (--max-message-bytes); "
            "send fewer rows a request"
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
