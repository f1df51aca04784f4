"""How many unary inference calls may wait for room in a model's queue at once, over the server.

A stream's request that finds its application's share of a model's queue full waits in the server
for room (``batching.admission``), and what that costs is bounded by the stream itself: its reader
waits with it, so one request per stream waits. A unary call (KServe ``ModelInfer`` on either
gRPC front end, KServe HTTP ``infer``) has no such reader: every call that waits holds its
handler (a coroutine, a native port's call slot, an HTTP connection) and its message's bytes
until it is queued or refused, and a client may open as many calls as it likes. The unary calls
that wait are therefore counted here, over the whole server, and a call finding
``max_calls`` waiting already is refused at once, as every call was before waits existed.

What one client can take this way is at most every place: the other clients' calls are then
refused at once, as before waits existed, and never held longer (a waiting request is admitted by
the rule a new one is, an application's in their order of arrival, ``batching.admission``). The
bytes of the waiting calls stay within the server's bounds on unary calls (``--max-unary-held-bytes``,
``--max-concurrent-calls``), which hold them whether they wait for room or for their batch.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class CallRoomWaits:
    """The unary calls of one server waiting for room in their models' queues; ``gauge`` shows
    how many (``udfserve_queue_room_waiting_calls``)."""

    def __init__(self, max_calls: int, gauge: Gauge | None = None) -> None:
        if max_calls < 0:
            raise ValueError(f"max_calls must be 0 or more, received {max_calls}")
        self.max_calls = max_calls
        self.waiting = 0
        """Calls that took a place to wait and have not left the wait yet."""
        self._gauge = gauge

    def take(self) -> bool:
        """A place for one more call to wait, or False when ``max_calls`` calls wait already."""
        if self.waiting >= self.max_calls:
            return False
        self._count(+1)
        return True

    def release_when(self, hold: asyncio.Future[None] | None) -> None:
        """Give a taken place back once ``hold`` is done (the call left the wait: queued, refused
        or gone), or now when the call did not wait (``hold`` None or done already)."""
        if hold is None or hold.done():
            self._release()
        else:
            hold.add_done_callback(self._released)

    def _released(self, _hold: asyncio.Future[None]) -> None:
        self._release()

    def _release(self) -> None:
        self._count(-1)

    def _count(self, delta: int) -> None:
        self.waiting += delta
        if self._gauge is not None:
            self._gauge.set(self.waiting)
