"""Many requests on one gRPC stream, answered concurrently and in completion order.

Both protocols of the server (the Arrow ``Predict`` stream and KServe's ``ModelStreamInfer``)
answer the requests of one stream this way, so a client with several batches in flight has
them batched together with everyone else's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_IN_FLIGHT_PER_STREAM = 64
"""Requests of one stream processed at once; beyond it the server stops reading the stream
and HTTP/2 flow control pushes back on the client."""


async def answer_concurrently(
    requests: AsyncIterator[T], answer: Callable[[T], Awaitable[R]], limit: int
) -> AsyncIterator[R]:
    """Answers of ``requests`` in completion order, at most ``limit`` running at once.

    Beyond the limit the stream is not read, so HTTP/2 flow control pushes back on the client.
    """
    results: asyncio.Queue[R | BaseException | None] = asyncio.Queue()
    slots = asyncio.Semaphore(limit)
    tasks: set[asyncio.Task[None]] = set()

    async def run(request: T) -> None:
        try:
            await results.put(await answer(request))
        finally:
            slots.release()

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                task = asyncio.create_task(run(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks))
            await results.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the stream broke (client gone, oversized message)
            await results.put(exc)

    reader = asyncio.create_task(read())
    try:
        while True:
            item = await results.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        reader.cancel()
        for task in list(tasks):
            task.cancel()
