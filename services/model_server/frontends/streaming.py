"""Many requests on one gRPC stream, answered concurrently and in completion order.

Both protocols of the server (the Arrow ``Predict`` stream and KServe's ``ModelStreamInfer``)
answer the requests of one stream this way, so a client with several batches in flight has
them batched together with everyone else's.

One task reads the stream. What a request needs before it waits (decoding, checking,
queueing in the batcher) runs inline in that task, and what it waits for is one future whose
completion callback makes the answer (``answer_inline``, ``Pending``): no task, semaphore or
queue per request, which on a busy stream cost as much as the request's own work. Answers that
must await several things run as tasks (``answer_concurrently``).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from services.model_server.core.pending import Pending

T = TypeVar("T")
R = TypeVar("R")

MAX_IN_FLIGHT_PER_STREAM = 64
"""Requests of one stream processed at once; beyond it the server stops reading the stream
and HTTP/2 flow control pushes back on the client."""


async def answer_inline(
    requests: AsyncIterator[T], start: Callable[[T], R | Pending[R]], limit: int
) -> AsyncIterator[R]:
    """Answers of ``requests`` in completion order, at most ``limit`` pending at once.

    ``start(request)`` runs in the task that reads the stream and returns the answer, or a
    ``Pending`` one. It should not raise: an exception from it, from ``finish`` or from the
    stream itself (the client went away, an oversized message) ends the stream with that
    exception once the answers ready before it are out. Beyond the limit the stream is not read,
    so HTTP/2 flow control pushes back on the client. When the consumer stops, pending futures
    are cancelled.
    """
    answers: _Answers[T, R] = _Answers(asyncio.get_running_loop(), limit)
    reader = asyncio.create_task(answers.read(requests, start))
    try:
        while True:
            if answers.ready:
                yield answers.ready.popleft()
            elif answers.failure is not None:
                raise answers.failure
            elif answers.ended:
                return
            else:
                await answers.wait()
    finally:
        answers.close()
        reader.cancel()


async def answer_concurrently(
    requests: AsyncIterator[T], answer: Callable[[T], Awaitable[R]], limit: int
) -> AsyncIterator[R]:
    """Answers of ``requests`` in completion order, each ``answer(request)`` run as its own task,
    at most ``limit`` running at once. Beyond the limit the stream is not read, so HTTP/2 flow
    control pushes back on the client."""

    def start(request: T) -> Pending[R]:
        return Pending(asyncio.ensure_future(answer(request)), _result_of)

    results: AsyncIterator[R] = answer_inline(requests, start, limit)
    async for result in results:
        yield result


def _result_of(future: asyncio.Future[R]) -> R:
    return future.result()


class _Answers(Generic[T, R]):
    """The state one stream's reader and consumer share."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, received {limit}")
        self._loop = loop
        self._limit = limit
        self.ready: deque[R] = deque()
        self.failure: BaseException | None = None
        self.ended = False
        self._pending: set[asyncio.Future[Any]] = set()
        self._read_all = False
        self._closed = False
        self._consumer: asyncio.Future[None] | None = None
        self._reader: asyncio.Future[None] | None = None

    async def read(self, requests: AsyncIterator[T], start: Callable[[T], R | Pending[R]]) -> None:
        try:
            async for request in requests:
                outcome = start(request)
                if not isinstance(outcome, Pending):
                    self._deliver(outcome)
                    continue
                future = outcome.future
                self._pending.add(future)
                future.add_done_callback(functools.partial(self._on_done, outcome.finish))
                if len(self._pending) >= self._limit:
                    self._reader = self._loop.create_future()
                    await self._reader
            self._read_all = True
            if not self._pending:
                self._end()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the stream broke (client gone, oversized message)
            self._fail(exc)

    def _on_done(self, finish: Callable[[asyncio.Future[Any]], R], future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        try:
            answer = finish(future)
        except asyncio.CancelledError:
            pass  # the request was cancelled with its stream: there is nothing to deliver
        except BaseException as exc:
            self._fail(exc)
        else:
            if not future.cancelled():
                self._deliver(answer)
        reader = self._reader
        if reader is not None and len(self._pending) < self._limit:
            self._reader = None
            if not reader.done():
                reader.set_result(None)
        if self._read_all and not self._pending:
            self._end()

    def _deliver(self, answer: R) -> None:
        if self._closed:
            return
        self.ready.append(answer)
        self._wake_consumer()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self._wake_consumer()

    def _end(self) -> None:
        self.ended = True
        self._wake_consumer()

    def _wake_consumer(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            self._consumer = None
            if not consumer.done():
                consumer.set_result(None)

    async def wait(self) -> None:
        """Until an answer is ready, the stream failed or every answer is out."""
        self._consumer = self._loop.create_future()
        await self._consumer

    def close(self) -> None:
        """The consumer stopped: pending answers are not wanted any more."""
        self._closed = True
        for future in list(self._pending):
            future.cancel()
