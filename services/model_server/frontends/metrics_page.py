"""The ``/metrics`` page: rendered in the admin thread, shared by concurrent scrapes, paced.

Rendering the page is pure Python that holds the GIL, about 0.23 ms per tracked Spark
application here (15 ms with 64 applications, 0.11 s with 512), and every render is time the
serving loop does not run. So renders are paced: after a render that took ``d`` seconds of the
admin thread's CPU, the next one starts no sooner than ``max(min_interval_s, d * (1 /
RENDER_SHARE - 1))`` later, which keeps rendering under ``RENDER_SHARE`` of a core however often
it is scraped. (CPU time, not wall time: on a busy machine a render waits for the GIL and the
cores, and pacing by its wall time would space the renders of a large page tens of seconds apart,
past a scraper's timeout.) Scrapes that arrive before the next render starts wait for it and
share it.

A scrape is never answered with a page rendered before it arrived: a test or an operator that
reads a counter, sends requests and reads it again sees every request, which a page cached for
a fixed time would not guarantee. What pacing costs is latency: a scrape waits at most one pace
interval (``min_interval_s``, or 50 times the last render: a few ms for a small page).

A scraper that accepts gzip (Prometheus sends ``Accept-Encoding: gzip``) gets the page compressed,
about a tenth of its size. A render is compressed at most once, when a scrape first asks for it
compressed, and the compression's CPU time counts in the pace as the render's does.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable

RENDER_SHARE = 0.02
"""Most of a core's time that rendering ``/metrics`` may take, whatever the scrape rate."""

GZIP_LEVEL = 6
"""zlib's default: within a few percent of the smallest output of a metrics page, at a third of
the time of level 9."""


class MetricsPage:
    """Renders of ``render``, shared by the scrapes that wait for them and paced (see the module).

    Used from one event loop only (the admin app's)."""

    def __init__(self, render: Callable[[], bytes], min_interval_s: float = 0.0) -> None:
        self._render = render
        self._min_interval_s = min_interval_s
        self._due = 0.0
        self._next: asyncio.Future[bytes] | None = None
        self._compressed: tuple[bytes, bytes] | None = None
        """The last render compressed: (the render, its gzip)."""

    async def page(self, gzipped: bool = False) -> bytes:
        """A page rendered after this call began; gzip-compressed when ``gzipped``."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._render_when_due())
        # shielded: a scraper that hangs up does not cancel the render the others wait for
        body = await asyncio.shield(self._next)
        return self._gzip(body) if gzipped else body

    def _gzip(self, body: bytes) -> bytes:
        """``body`` compressed, once per render; its CPU time delays the next render as a render's."""
        if self._compressed is None or self._compressed[0] is not body:
            cpu_started = time.thread_time()
            self._compressed = (body, gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0))
            took = time.thread_time() - cpu_started
            self._due += took * (1.0 / RENDER_SHARE - 1.0)
        return self._compressed[1]

    async def _render_when_due(self) -> bytes:
        delay = self._due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self._next = None  # a scrape from here on needs the next render
        cpu_started = time.thread_time()
        body = self._render()  # synchronous: no scrape arrives during it on this loop
        took = time.thread_time() - cpu_started
        self._due = time.monotonic() + max(self._min_interval_s, took * (1.0 / RENDER_SHARE - 1.0))
        return body
