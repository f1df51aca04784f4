"""The KServe HTTP port's bounds: the token, requests at once, body size (as sent and decompressed)
and the bytes of bodies held, each refusal in the protocol's JSON with its status."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from udfserve.services.model_server.frontends.kserve_http.bounds import HttpBudget, HttpRefused, PortBounds

TOKEN = "s3cret"
LIMIT = 1000


def port(release: asyncio.Event | None = None, **limits: object) -> tuple[PortBounds, httpx.AsyncClient]:
    """A port of one echoing route behind ``PortBounds``; ``release``: what the route waits for
    after reading the body."""
    settings = {"max_requests": 4, "max_body_bytes": LIMIT, "max_held_bytes": 10 * LIMIT, **limits}
    bounds = PortBounds(CollectorRegistry(), **settings)  # type: ignore[arg-type]

    async def echo(request: Request) -> Response:
        try:
            async with bounds.body(request) as body:
                if release is not None:
                    await release.wait()
                return Response(body)
        except HttpRefused as exc:
            return Response(exc.message, exc.status)

    async def live(request: Request) -> Response:
        return Response(b"")

    app = Starlette(routes=[Route("/v2/echo", echo, methods=["POST"]), Route("/v2/health/live", live)])
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=bounds.guard(app)), base_url="http://port")
    return bounds, client


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_without_the_token_every_route_but_health_is_refused_401_in_json() -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        _, client = port(token=TOKEN)
        async with client:
            refused = await client.post("/v2/echo", content=b"x")
            allowed = await client.post(
                "/v2/echo", content=b"x", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            health = await client.get("/v2/health/live")
        return refused, allowed, health

    refused, allowed, health = run(scenario())  # type: ignore[misc]
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer <token>" in refused.json()["error"]
    assert (allowed.status_code, allowed.content) == (200, b"x")
    assert health.status_code == 200


def test_a_request_beyond_the_most_at_once_is_refused_503_with_retry_after() -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        release = asyncio.Event()
        bounds, client = port(release, max_requests=1)
        async with client:
            held = asyncio.create_task(client.post("/v2/echo", content=b"first"))
            while bounds.requests < 1:
                await asyncio.sleep(0)
            refused = await client.post("/v2/echo", content=b"second")
            release.set()
            return await held, refused

    held, refused = run(scenario())  # type: ignore[misc]
    assert (held.status_code, held.content) == (200, b"first")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "--max-concurrent-calls" in refused.json()["error"]


def test_a_body_declared_over_the_limit_is_refused_413_before_it_is_read() -> None:
    async def scenario() -> tuple[httpx.Response, PortBounds]:
        bounds, client = port()
        async with client:
            return await client.post("/v2/echo", content=b"x" * (LIMIT + 1)), bounds

    response, bounds = run(scenario())  # type: ignore[misc]
    assert response.status_code == 413
    assert f"limit of {LIMIT} bytes (--max-message-bytes)" in response.text
    assert bounds.refusals.labels(reason="too_large")._value.get() == 1


def test_a_body_of_unknown_length_is_refused_413_once_it_passes_the_limit() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"y" * 300

    async def scenario() -> httpx.Response:
        _, client = port()
        async with client:
            return await client.post("/v2/echo", content=chunks())

    response = run(scenario())
    assert response.status_code == 413  # type: ignore[attr-defined]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_read_decompressed(encoding: str) -> None:
    data = b"tensor bytes " * 50
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)

    async def scenario() -> httpx.Response:
        _, client = port()
        async with client:
            return await client.post("/v2/echo", content=packed, headers={"Content-Encoding": encoding})

    response = run(scenario())
    assert response.content == data  # type: ignore[attr-defined]


def test_a_compressed_body_over_the_limit_once_decompressed_is_refused_413() -> None:
    bomb = gzip.compress(bytes(100 * LIMIT))
    assert len(bomb) < LIMIT

    async def scenario() -> httpx.Response:
        _, client = port()
        async with client:
            return await client.post("/v2/echo", content=bomb, headers={"Content-Encoding": "gzip"})

    response = run(scenario())
    assert response.status_code == 413 and "once decompressed" in response.text  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("encoding", "content", "status", "expected"),
    [
        ("br", b"x", 415, "expected gzip, deflate or none"),
        ("gzip", b"not gzip at all", 400, "is not gzip data"),
        ("gzip", gzip.compress(b"cut short", mtime=0)[:-6], 400, "ends before its data does"),
    ],
    ids=["unknown encoding", "not gzip", "gzip cut short"],  # the same in every process of a parallel run
)
def test_a_body_that_is_not_as_its_encoding_says_is_refused_naming_it(
    encoding: str, content: bytes, status: int, expected: str
) -> None:
    async def scenario() -> httpx.Response:
        _, client = port()
        async with client:
            return await client.post("/v2/echo", content=content, headers={"Content-Encoding": encoding})

    response = run(scenario())
    assert response.status_code == status and expected in response.text  # type: ignore[attr-defined]


# -- the budget of held bytes ------------------------------------------------------------------
def budget(limit: int) -> HttpBudget:
    registry = CollectorRegistry()
    return HttpBudget(
        limit, Gauge("held", "held", registry=registry), Gauge("waiting", "waiting", registry=registry)
    )


def test_one_request_is_read_while_none_is_held_whatever_its_size() -> None:
    async def scenario() -> int:
        held = budget(100)
        await held.reserve(5000)
        return held.held_bytes

    assert run(scenario()) == 5000


def test_a_request_without_room_waits_unread_until_room_is_given_back_first_come_first_served() -> None:
    async def scenario() -> list[str]:
        held = budget(100)
        order: list[str] = []
        await held.reserve(80)

        async def waiter(name: str, size: int) -> None:
            await held.reserve(size)
            order.append(name)

        first = asyncio.create_task(waiter("first", 60))
        second = asyncio.create_task(waiter("second", 10))  # would fit, but waits its turn
        await asyncio.sleep(0)
        assert order == [] and held.held_bytes == 80
        held.release(80)
        await asyncio.gather(first, second)
        return order

    assert run(scenario()) == ["first", "second"]


def test_a_waiting_request_whose_client_leaves_gives_its_turn_to_the_next() -> None:
    async def scenario() -> int:
        held = budget(100)
        await held.reserve(100)
        gone = asyncio.create_task(held.reserve(50))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        held.release(100)
        await held.reserve(30)
        return held.held_bytes

    assert run(scenario()) == 30
