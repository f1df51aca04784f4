"""An answer that a request's future will make: what the lifecycle hands a front end for a
request it queued, so that a stream can hold it without a task per request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

R = TypeVar("R")


class Pending(NamedTuple, Generic[R]):
    """An answer known once ``future`` is done: ``finish(future)`` makes it, on the event loop.

    ``finish`` is called exactly once, also when the future was cancelled because the stream
    closed first (its answer is then dropped; it may raise ``CancelledError``), so that it can
    release what the request held.

    ``hold``, when given, is done once the request left the wait for room in its model's queue
    (``batching.admission``): a stream reads its next request only then."""

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], R]
    hold: asyncio.Future[None] | None = None
