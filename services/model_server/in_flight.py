"""Requests accepted and not yet answered, across every protocol the server speaks.

Draining waits on this one count, so a SIGTERM answers the Arrow and the KServe requests
already accepted alike before the listeners close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class InFlightRequests:
    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    async def wait_idle(self) -> None:
        """Return once every accepted request has been answered."""
        await self._idle.wait()
