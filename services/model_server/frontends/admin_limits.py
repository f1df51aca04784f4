"""How much of the process the HTTP admin app may take: a pace for all its requests, a rate per client.

The admin app shares the interpreter (and its GIL) with the serving loop, so every admin request
costs the predictions some CPU. Two limits bound that cost whatever clients send:

- **A pace for the whole app** (``total_per_s``, a token bucket that lends its future tokens):
  a request beyond it waits for its turn before anything of it runs, instead of being answered
  at once. A flood then costs at most ``total_per_s`` requests a second, over any number of
  connections (uvicorn holds at most one request per connection, and at most
  ``ADMIN_MAX_CONNECTIONS`` connections), and its clients wait, idle, instead of looping.
- **A rate per client address** (``per_client_per_s``, bursts of twice that): a client over it
  is answered 429 with ``Retry-After``, so one flooding address does not take the turns of
  Prometheus or of a probe. The table of clients is bounded (``MAX_TRACKED_CLIENTS``, least
  recently seen out), so many addresses cannot make it grow.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

ADMIN_MAX_CONNECTIONS = 64
"""Connections the admin app holds at once (uvicorn answers 503 beyond): what bounds the requests
waiting for their turn, and their memory."""

PACE_TICK_S = 0.1
"""Requests that wait for the app's pace are let through on ticks of this length, together: the
admin thread then takes the GIL ten times a second under a flood instead of once per request,
and each hand-over of the GIL between the threads can cost the serving loop a wait for a core."""

MAX_TRACKED_CLIENTS = 1024
"""Client addresses whose rate is remembered; beyond, the one seen least recently is forgotten."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    __slots__ = ("_at", "_burst", "_rate", "_tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._at = now

    def _refill(self, now: float) -> None:
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 when one was there, else the seconds until one will be (none taken)."""
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    def reserve(self, now: float) -> float:
        """Take a token now or in the future: the seconds to wait until it is due (0.0: at once)."""
        self._refill(now)
        self._tokens -= 1.0
        return max(0.0, -self._tokens / self._rate)


class ClientRates:
    """A token bucket per client address, for at most ``max_clients`` addresses."""

    def __init__(self, per_client_per_s: float, max_clients: int = MAX_TRACKED_CLIENTS) -> None:
        self._rate = per_client_per_s
        self._burst = max(1.0, 2.0 * per_client_per_s)
        self._max_clients = max_clients
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: str, now: float) -> float:
        """0.0 when ``client`` may be answered now, else the seconds until it may."""
        bucket = self._buckets.get(client)
        if bucket is None:
            while len(self._buckets) >= self._max_clients:
                self._buckets.popitem(last=False)
            bucket = self._buckets[client] = TokenBucket(self._rate, self._burst, now)
        else:
            self._buckets.move_to_end(client)
        return bucket.take(now)


class AdminRateLimit:
    """ASGI middleware: every HTTP request waits for the app's pace, then is answered 429 if its
    client is over its rate. ``on_refused`` counts the refusals (a metric)."""

    def __init__(
        self,
        app: AsgiApp,
        per_client_per_s: float,
        total_per_s: float,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self._app = app
        self._per_client_per_s = per_client_per_s
        self._clients = ClientRates(per_client_per_s)
        self._pace = TokenBucket(total_per_s, max(1.0, total_per_s / 10), time.monotonic())
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        now = time.monotonic()
        delay = self._pace.reserve(now)
        if delay > 0.0:
            await asyncio.sleep(math.ceil((now + delay) / PACE_TICK_S) * PACE_TICK_S - now)
        client = scope.get("client")
        address = str(client[0]) if client else ""
        retry_after_s = self._clients.take(address, time.monotonic())
        if retry_after_s > 0.0:
            self._on_refused()
            await self._refuse(send, address, retry_after_s)
            return
        await self._app(scope, receive, send)

    async def _refuse(self, send: Send, address: str, retry_after_s: float) -> None:
        body = json.dumps(
            {
                "detail": f"too many admin requests from {address or 'this client'}: expected at most "
                f"{self._per_client_per_s:g} a second (bursts of twice that); retry after "
                f"{retry_after_s:.2f} s"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(math.ceil(retry_after_s)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
