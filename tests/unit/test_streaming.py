"""Answering the requests of one stream: in completion order, a bound on what is pending, every
pending answer released when the stream closes, and a broken stream reported after the answers
that were ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

import pytest

from services.model_server.frontends.streaming import Pending, answer_concurrently, answer_inline

T = TypeVar("T")
SAFETY_TIMEOUT_S = 8.0


def run(test: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), timeout=SAFETY_TIMEOUT_S)

    return asyncio.run(bounded())


async def stream(items: Iterable[int], read: list[int] | None = None) -> AsyncIterator[int]:
    for item in items:
        if read is not None:
            read.append(item)
        yield item


class Futures:
    """One future per request, resolved by the test; ``finished`` lists what ``finish`` saw."""

    def __init__(self) -> None:
        self.by_request: dict[int, asyncio.Future[int]] = {}
        self.finished: list[tuple[int, str]] = []

    def start(self, request: int) -> Pending[str]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.by_request[request] = future

        def finish(done: asyncio.Future[int]) -> str:
            state = "cancelled" if done.cancelled() else f"answer {done.result()}"
            self.finished.append((request, state))
            return state

        return Pending(future, finish)


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition`` holds (the safety timeout bounds it)."""
    while not condition():
        await asyncio.sleep(0)


def test_answers_come_in_completion_order() -> None:
    futures = Futures()

    async def body() -> list[str]:
        answers = answer_inline(stream([1, 2, 3]), futures.start, limit=8)
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(futures.by_request) == 3)
        futures.by_request[3].set_result(30)
        received = [await first]
        futures.by_request[1].set_result(10)
        futures.by_request[2].set_result(20)
        received += [answer async for answer in answers]
        return received

    assert run(body) == ["answer 30", "answer 10", "answer 20"]


def test_an_answer_known_at_once_is_sent_without_waiting() -> None:
    async def body() -> list[str]:
        return [answer async for answer in answer_inline(stream([1, 2]), lambda r: f"refused {r}", limit=1)]

    assert run(body) == ["refused 1", "refused 2"]


def test_the_stream_is_not_read_beyond_the_limit_of_pending_answers() -> None:
    futures = Futures()
    read: list[int] = []

    async def body() -> None:
        answers = answer_inline(stream(range(10), read), futures.start, limit=3)
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(futures.by_request) == 3)
        for _ in range(3):
            await asyncio.sleep(0)  # the reader would go on here if it were not bounded
        assert read == [0, 1, 2]
        futures.by_request[0].set_result(0)
        assert await first == "answer 0"
        await wait_until(lambda: len(read) == 4)
        for request in range(1, 10):
            await wait_until(lambda request=request: request in futures.by_request)
            futures.by_request[request].set_result(request)
        assert len([answer async for answer in answers]) == 9

    run(body)


def test_pending_answers_are_cancelled_and_finished_when_the_stream_closes() -> None:
    futures = Futures()

    async def body() -> None:
        answers = answer_inline(stream([1, 2, 3]), futures.start, limit=8)
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(futures.by_request) == 3)
        futures.by_request[2].set_result(20)
        assert await first == "answer 20"
        await answers.aclose()
        await wait_until(lambda: len(futures.finished) == 3)

    run(body)
    assert sorted(futures.finished) == [(1, "cancelled"), (2, "answer 20"), (3, "cancelled")]


def test_a_broken_request_stream_ends_the_answers_with_its_error_after_the_ready_ones() -> None:
    async def broken() -> AsyncIterator[int]:
        yield 1
        raise ConnectionResetError("client went away")

    async def body() -> list[str]:
        received = []
        with pytest.raises(ConnectionResetError, match="client went away"):
            async for answer in answer_inline(broken(), lambda r: f"refused {r}", limit=4):
                received.append(answer)
        return received

    assert run(body) == ["refused 1"]


def test_answer_concurrently_runs_each_answer_as_a_task() -> None:
    release = {}

    async def answer(request: int) -> int:
        release[request] = asyncio.Event()
        await release[request].wait()
        return request * 10

    async def body() -> list[int]:
        answers = answer_concurrently(stream([1, 2]), answer, limit=4)
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(release) == 2)
        release[2].set()
        received = [await first]
        release[1].set()
        received += [result async for result in answers]
        return received

    assert run(body) == [20, 10]
