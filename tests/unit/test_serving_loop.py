"""Reads the admin thread makes on the serving loop: run there, result or error handed back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from udfserve.services.model_server.frontends.admin_server import ServingLoop, ServingLoopUnresponsive


def on_admin_thread(
    serving: ServingLoop, read: Callable[[], object]
) -> tuple[list[object], threading.Thread]:
    """``serving.call(read)`` awaited on a loop of another thread, as the admin app does."""
    outcome: list[object] = []

    def admin() -> None:
        try:
            outcome.append(asyncio.run(serving.call(read, timeout_s=60)))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=admin)
    thread.start()
    return outcome, thread


def test_a_read_runs_on_the_serving_loop_and_its_result_comes_back() -> None:
    async def serving_loop() -> tuple[object, int, int]:
        serving = ServingLoop(asyncio.get_running_loop())
        outcome, thread = on_admin_thread(serving, threading.get_ident)
        await asyncio.to_thread(thread.join, 60)
        return outcome[0], threading.get_ident(), thread.ident or 0

    ran_on, serving_thread, admin_thread = asyncio.run(serving_loop())
    assert ran_on == serving_thread != admin_thread


def test_an_error_of_the_read_is_raised_in_the_admin_thread() -> None:
    def read() -> None:
        raise LookupError("no model called 'x'")

    async def serving_loop() -> object:
        outcome, thread = on_admin_thread(ServingLoop(asyncio.get_running_loop()), read)
        await asyncio.to_thread(thread.join, 60)
        return outcome[0]

    error = asyncio.run(serving_loop())
    assert isinstance(error, LookupError) and "'x'" in str(error)


def test_a_closed_serving_loop_is_reported_unresponsive() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(ServingLoopUnresponsive, match="stopped"):
        asyncio.run(ServingLoop(loop).call(lambda: None))
