"""The /metrics page: scrapes that arrive together share one render, and none gets an older page."""

from __future__ import annotations

import asyncio
import gzip
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


def test_a_scrape_asking_for_gzip_gets_the_render_it_shares_compressed() -> None:
    page, _ = counting_render()

    async def scenario() -> list[bytes]:
        return await asyncio.gather(page.page(), page.page(gzipped=True))

    plain, compressed = asyncio.run(scenario())
    assert plain == b"1" and gzip.decompress(compressed) == b"1"


def test_scrapes_sharing_a_render_share_one_compression_of_it() -> None:
    page, _ = counting_render()

    async def scenario() -> list[bytes]:
        return await asyncio.gather(*(page.page(gzipped=True) for _ in range(3)))

    first, second, third = asyncio.run(scenario())
    assert first is second is third


def test_a_later_render_is_compressed_anew() -> None:
    page, _ = counting_render()

    async def scenario() -> list[bytes]:
        return [await page.page(gzipped=True), await page.page(gzipped=True)]

    assert [gzip.decompress(body) for body in asyncio.run(scenario())] == [b"1", b"2"]
