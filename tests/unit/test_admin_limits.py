"""The admin app's limits: a rate per client answered 429, a pace for the whole app, bounded memory."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from udfserve.services.model_server.frontends.admin_limits import AdminRateLimit, ClientRates, TokenBucket


def test_a_bucket_gives_its_burst_then_says_when_the_next_token_is_due() -> None:
    bucket = TokenBucket(rate=4.0, burst=2.0, now=100.0)
    assert [bucket.take(100.0), bucket.take(100.0)] == [0.0, 0.0]
    assert bucket.take(100.0) == 0.25
    assert bucket.take(100.25) == 0.0


def test_a_reservation_beyond_the_burst_waits_its_turn_in_order() -> None:
    pace = TokenBucket(rate=4.0, burst=1.0, now=0.0)
    waits = [pace.reserve(0.0) for _ in range(4)]
    assert waits == [0.0, 0.25, 0.5, 0.75]


def test_the_table_of_clients_stays_bounded_whatever_addresses_come() -> None:
    rates = ClientRates(per_client_per_s=1.0, max_clients=8)
    for i in range(10_000):
        rates.take(f"10.0.{i // 256}.{i % 256}", now=0.0)
    assert len(rates) == 8


def test_one_client_over_its_rate_leaves_the_others_their_turns() -> None:
    rates = ClientRates(per_client_per_s=1.0)
    assert [rates.take("10.0.0.1", 0.0) for _ in range(3)] == [0.0, 0.0, 1.0]
    assert rates.take("10.0.0.2", 0.0) == 0.0


def limited_app(per_client_per_s: float, refusals: list[int]) -> AdminRateLimit:
    async def ok(_request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/health/live", ok)])
    return AdminRateLimit(app, per_client_per_s, total_per_s=1000.0, on_refused=lambda: refusals.append(1))


def test_a_client_over_its_rate_is_answered_429_with_retry_after_and_a_reason() -> None:
    refusals: list[int] = []

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=limited_app(0.001, refusals))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return [await client.get("/health/live") for _ in range(2)]

    first, second = asyncio.run(scenario())
    assert first.status_code == 200
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert "too many admin requests" in second.json()["detail"]
    assert "at most 0.001 a second" in second.json()["detail"]
    assert refusals == [1]
