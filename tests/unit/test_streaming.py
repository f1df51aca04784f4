"""Answering the requests of one stream: in completion order, a bound on what the stream holds
(pending, answered and not yet written, by count and by bytes), every pending answer released when
the stream closes, and a broken stream reported after the answers that were ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

import pytest

from udfserve.services.model_server.frontends.streaming import (
    Pending,
    StreamBounds,
    answer_inline,
)

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


async def collect(answers: AsyncIterator[str]) -> list[str]:
    return [answer async for answer in answers]


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition`` holds (the safety timeout bounds it)."""
    while not condition():
        await asyncio.sleep(0)


def test_answers_come_in_completion_order() -> None:
    futures = Futures()

    async def body() -> list[str]:
        answers = answer_inline(stream([1, 2, 3]), futures.start, StreamBounds(8))
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
        return [
            answer
            async for answer in answer_inline(stream([1, 2]), lambda r: f"refused {r}", StreamBounds(1))
        ]

    assert run(body) == ["refused 1", "refused 2"]


def test_the_stream_is_not_read_beyond_its_bound_of_pending_answers() -> None:
    futures = Futures()
    read: list[int] = []

    async def body() -> None:
        answers = answer_inline(stream(range(10), read), futures.start, StreamBounds(3))
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(futures.by_request) == 3)
        for _ in range(3):
            await asyncio.sleep(0)  # the reader would go on here if it were not bounded
        assert read == [0, 1, 2]
        futures.by_request[0].set_result(0)
        assert await first == "answer 0"
        rest = asyncio.ensure_future(collect(answers))  # answer 0 written: one more request is read
        await wait_until(lambda: len(read) == 4)
        for request in range(1, 10):
            await wait_until(lambda request=request: request in futures.by_request)
            futures.by_request[request].set_result(request)
        assert len(await rest) == 9

    run(body)


def test_pending_answers_are_cancelled_and_finished_when_the_stream_closes() -> None:
    futures = Futures()

    async def body() -> None:
        answers = answer_inline(stream([1, 2, 3]), futures.start, StreamBounds(8))
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
            async for answer in answer_inline(broken(), lambda r: f"refused {r}", StreamBounds(4)):
                received.append(answer)
        return received

    assert run(body) == ["refused 1"]


def test_answers_ready_at_once_stop_the_reader_while_the_consumer_does_not_take_them() -> None:
    read: list[int] = []

    async def body() -> None:
        answers = answer_inline(stream(range(1000), read), lambda r: f"refused {r}", StreamBounds(3))
        assert await anext(answers) == "refused 0"  # taken, and not yet written: the consumer waits
        await wait_until(lambda: len(read) == 3)
        for _ in range(10):
            await asyncio.sleep(0)  # the reader would go on here if refusals were not held
        assert read == [0, 1, 2]
        assert await anext(answers) == "refused 1"  # the first answer is written: one more is read
        await wait_until(lambda: len(read) == 4)
        await answers.aclose()

    run(body)


def test_the_stream_is_not_read_beyond_its_bound_of_bytes() -> None:
    read: list[int] = []

    async def body() -> None:
        requests = stream(range(100), read)
        answers = answer_inline(
            requests,
            lambda r: "",
            StreamBounds(max_requests=100, max_bytes=250),
            size_of=lambda _request: 100,
        )
        await anext(answers)
        await wait_until(lambda: len(read) == 3)
        for _ in range(10):
            await asyncio.sleep(0)
        assert read == [0, 1, 2]  # 300 bytes held: the third took the stream past its 250
        await answers.aclose()

    run(body)


def test_a_stream_holding_nothing_reads_a_request_larger_than_its_bound_of_bytes() -> None:
    async def body() -> list[str]:
        bounds = StreamBounds(max_requests=8, max_bytes=10)
        return [answer async for answer in answer_inline(stream([1, 2]), str, bounds, size_of=lambda _: 1000)]

    assert run(body) == ["1", "2"]


def test_pending_answers_and_answers_not_yet_written_share_the_bound() -> None:
    futures = Futures()

    async def body() -> None:
        answers = answer_inline(stream(range(10)), futures.start, StreamBounds(2))
        first = asyncio.ensure_future(anext(answers))
        await wait_until(lambda: len(futures.by_request) == 2)
        futures.by_request[0].set_result(0)
        assert await first == "answer 0"  # answered, not yet written: still held
        futures.by_request[1].set_result(1)
        for _ in range(10):
            await asyncio.sleep(0)
        assert sorted(futures.by_request) == [0, 1]
        assert await anext(answers) == "answer 1"  # answer 0 is written: request 2 is read
        await wait_until(lambda: 2 in futures.by_request)
        await answers.aclose()

    run(body)


def test_a_paused_stream_is_counted_while_it_waits() -> None:
    class Gauge:
        value = 0

        def inc(self) -> None:
            self.value += 1

        def dec(self) -> None:
            self.value -= 1

    paused = Gauge()

    async def body() -> None:
        answers = answer_inline(stream(range(10)), str, StreamBounds(2), paused=paused)
        await anext(answers)
        await wait_until(lambda: paused.value == 1)
        await answers.aclose()
        await wait_until(lambda: paused.value == 0)

    run(body)


def test_bounds_refuse_zero() -> None:
    with pytest.raises(ValueError, match="at least 1 request and 1 byte"):
        StreamBounds(max_requests=0)
