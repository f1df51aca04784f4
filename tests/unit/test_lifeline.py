"""The lifeline pipe: a server drains once the process that started it is gone."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from udfserve.services.model_server.lifeline import watch_lifeline

SAFETY_TIMEOUT_S = 8.0


def test_the_end_of_the_pipe_is_reported_once_when_its_write_end_closes() -> None:
    async def body() -> int:
        read_end, write_end = os.pipe()
        closed = asyncio.Event()
        calls = []

        def on_closed() -> None:
            calls.append(1)
            closed.set()

        watch_lifeline(read_end, on_closed)
        os.close(write_end)  # what the kernel does when the holder dies, however it dies
        await asyncio.wait_for(closed.wait(), SAFETY_TIMEOUT_S)
        await asyncio.sleep(0)  # a second report would come in the same turn
        return len(calls)

    assert asyncio.run(body()) == 1


def test_a_pipe_closed_before_the_watch_began_is_reported_at_once() -> None:
    """No window: a parent that died before its child began to watch is noticed all the same."""

    async def body() -> None:
        read_end, write_end = os.pipe()
        os.close(write_end)
        closed = asyncio.Event()
        watch_lifeline(read_end, closed.set)
        await asyncio.wait_for(closed.wait(), SAFETY_TIMEOUT_S)

    asyncio.run(body())


def test_a_descriptor_that_is_not_a_pipe_is_refused_naming_the_flag(tmp_path: Path) -> None:
    async def body() -> None:
        with (
            open(tmp_path / "file", "w") as file,
            pytest.raises(OSError, match=rf"--lifeline-fd {file.fileno()} is not a pipe"),
        ):
            watch_lifeline(file.fileno(), lambda: None)

    asyncio.run(body())


def test_a_descriptor_that_is_not_open_is_refused_naming_the_flag() -> None:
    async def body() -> None:
        read_end, write_end = os.pipe()
        os.close(read_end)
        os.close(write_end)
        with pytest.raises(OSError, match=rf"--lifeline-fd {read_end} is not an open file descriptor"):
            watch_lifeline(read_end, lambda: None)

    asyncio.run(body())
