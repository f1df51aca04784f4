"""After a large call is answered the server hands its freed memory back (glibc's malloc_trim),
at most once an interval, and never for small calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from udfserve.services.model_server.core.memory_trim import MemoryTrimmer, _glibc_malloc_trim
from udfserve.services.model_server.frontends.kserve.unary_budget import UnaryBudget
from udfserve.services.model_server.observability.metrics import ServerMetrics

MIB = 1 << 20
WAIT_S = 30.0
"""Safety limit of a wait for trims; each test ends at its event."""

malloc_trim = _glibc_malloc_trim()
pytestmark = pytest.mark.skipif(malloc_trim is None, reason="the C library is not glibc")


class TrimLog:
    """glibc's malloc_trim, with the times it was called."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, pad: int) -> int:
        self.times.append(time.monotonic())
        assert malloc_trim is not None
        return malloc_trim(pad)


async def trims_reach(trimmer: MemoryTrimmer, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while trimmer.trims < count:
        assert time.monotonic() < deadline, f"{trimmer.trims} trims, expected {count}"
        await asyncio.sleep(0.01)


def test_a_large_call_answered_trims_the_heap() -> None:
    async def scenario() -> int:
        trimmer = MemoryTrimmer(16 * MIB)
        trimmer.call_done(60 * MIB)
        await trims_reach(trimmer, 1)
        return trimmer.trims

    assert asyncio.run(scenario()) == 1


def test_small_calls_never_trim() -> None:
    log = TrimLog()

    async def scenario() -> None:
        trimmer = MemoryTrimmer(16 * MIB, trim=log)
        for _ in range(100):
            trimmer.call_done(16 * MIB - 1)
        large = MemoryTrimmer(16 * MIB, trim=log)  # the loop's turn after a trim that does run
        large.call_done(16 * MIB)
        await trims_reach(large, 1)

    asyncio.run(scenario())
    assert len(log.times) == 1


def test_large_calls_within_the_interval_trim_once_more_at_its_end() -> None:
    log = TrimLog()
    interval_s = 0.5

    async def scenario() -> None:
        trimmer = MemoryTrimmer(16 * MIB, min_interval_s=interval_s, trim=log)
        trimmer.call_done(60 * MIB)
        await trims_reach(trimmer, 1)
        for _ in range(10):
            trimmer.call_done(60 * MIB)
        await trims_reach(trimmer, 2)
        await asyncio.sleep(interval_s)  # room for a third, which must not come
        assert trimmer.trims == 2

    asyncio.run(scenario())
    assert len(log.times) == 2
    assert log.times[1] - log.times[0] >= interval_s


def test_trimming_off_never_trims() -> None:
    log = TrimLog()

    async def scenario() -> None:
        trimmer = MemoryTrimmer(0, trim=log)
        trimmer.call_done(60 * MIB)
        witness = MemoryTrimmer(1, trim=log)
        witness.call_done(1)
        await trims_reach(witness, 1)

    asyncio.run(scenario())
    assert len(log.times) == 1


def test_the_unary_budget_tells_the_trimmer_of_each_answered_call() -> None:
    async def scenario() -> int:
        trimmer = MemoryTrimmer(16 * MIB)
        budget = UnaryBudget(256 * MIB, 64 * MIB, ServerMetrics("cpu"), trimmer)
        reserved = await budget.reserve()
        held = budget.settle(reserved, 60 * MIB)
        budget.release(held)
        await trims_reach(trimmer, 1)
        return budget.held_bytes

    assert asyncio.run(scenario()) == 0
