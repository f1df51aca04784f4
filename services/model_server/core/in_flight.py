"""Requests accepted and not yet answered, across every protocol the server speaks.

Draining waits on this one count, so a SIGTERM answers the Arrow and the KServe requests
already accepted alike before the listeners close. It is updated twice per request, so it is
kept to plain attribute updates (the event changes only when the count leaves or reaches 0).
"""

from __future__ import annotations

import asyncio


class InFlightRequests:
    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return self._count

    def begin(self) -> None:
        """One more request accepted; pair with ``end`` once it is answered."""
        self._count += 1
        if self._count == 1:
            self._idle.clear()

    def end(self) -> None:
        """One accepted request answered (or abandoned by its client)."""
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once every accepted request has been answered."""
        await self._idle.wait()
