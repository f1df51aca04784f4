"""The /metrics page: scrapes that arrive together share one render, and none gets an older page."""

from __future__ import annotations

import asyncio
import itertools

from udfserve.services.model_server.frontends.metrics_page import MetricsPage


def counting_render() -> tuple[MetricsPage, itertools.count[int]]:
    renders = itertools.count(1)
    return MetricsPage(lambda: str(next(renders)).encode()), renders


def test_scrapes_that_arrive_together_share_one_render() -> None:
    page, _ = counting_render()

    async def scenario() -> list[bytes]:
        return await asyncio.gather(*(page.page() for _ in range(5)))

    assert asyncio.run(scenario()) == [b"1"] * 5


def test_a_scrape_after_a_render_gets_a_new_render() -> None:
    page, _ = counting_render()

    async def scenario() -> list[bytes]:
        return [await page.page(), await page.page()]

    assert asyncio.run(scenario()) == [b"1", b"2"]


def test_a_scraper_that_hangs_up_does_not_cancel_the_render_others_wait_for() -> None:
    page, _ = counting_render()

    async def scenario() -> bytes:
        gone = asyncio.ensure_future(page.page())
        staying = asyncio.ensure_future(page.page())
        await asyncio.sleep(0)  # both are waiting for the render
        gone.cancel()
        return await staying

    assert asyncio.run(scenario()) == b"1"
