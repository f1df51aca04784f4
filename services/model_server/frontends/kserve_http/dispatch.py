"""How the KServe HTTP port reaches the servicer, which lives on the serving loop.

The servicer, the model table, the batchers and the request lifecycle belong to the serving loop;
the port hands them its requests through one of two ``ServingCalls``, by where it runs
(``--kserve-http-loop``):

- ``OnServingLoop``: the port's uvicorn runs on the serving loop itself, so a request is started
  and awaited inline, as a gRPC ``ModelInfer`` handler does;
- ``FromOwnLoop``: the port runs on a thread and event loop of its own (as the admin app does);
  a request is started on the serving loop in one callback, and its answer handed back from the
  batcher's completion callback, two hand-overs between the threads per request.

Either way the HTTP parsing, the JSON and the answer's encoding run on the port's loop, and what
runs on the serving loop is what a gRPC request runs there: the checks, the queueing, the answer
as tensors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from udfserve.services.model_server.core.pending import Pending
from udfserve.services.model_server.frontends.admin_server import ServingLoopUnresponsive

A = TypeVar("A")
T = TypeVar("T")


class ServingCalls(ABC):
    """Runs the port's calls of the servicer on the serving loop."""

    @abstractmethod
    async def infer(self, start: Callable[[], A | Pending[A]]) -> A:
        """The answer of a request ``start`` (run on the serving loop) queued or answered."""

    @abstractmethod
    async def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float | None = None) -> T:
        """The result of the coroutine ``make()`` run on the serving loop; ``ServingLoopUnresponsive``
        when ``timeout_s`` passes first."""


class OnServingLoop(ServingCalls):
    """The port runs on the serving loop: everything inline."""

    async def infer(self, start: Callable[[], A | Pending[A]]) -> A:
        outcome = start()
        if not isinstance(outcome, Pending):
            return outcome
        future, finish = outcome.future, outcome.finish
        try:
            await future
        except asyncio.CancelledError:  # the port stops: release what the request holds
            future.cancel()
            finish(future)
            raise
        except Exception:
            pass  # the batcher's failure, answered by finish
        answer: A = finish(future)
        return answer

    async def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float | None = None) -> T:
        return await make()


class FromOwnLoop(ServingCalls):
    """The port runs on a loop of its own; ``serving`` is the serving loop."""

    def __init__(self, serving: asyncio.AbstractEventLoop) -> None:
        self._serving = serving

    async def infer(self, start: Callable[[], A | Pending[A]]) -> A:
        done: concurrent.futures.Future[A] = concurrent.futures.Future()
        queued: list[asyncio.Future[Any]] = []

        def run() -> None:  # on the serving loop
            if not done.set_running_or_notify_cancel():
                return  # the port gave up before the serving loop got to it
            try:
                outcome = start()
            except BaseException as exc:  # start answers failures itself: this is a fault
                done.set_exception(exc)
                return
            if not isinstance(outcome, Pending):
                done.set_result(outcome)
                return
            queued.append(outcome.future)
            finish = outcome.finish

            def finished(future: asyncio.Future[Any]) -> None:
                try:
                    done.set_result(finish(future))
                except BaseException as exc:  # CancelledError: the port stopped and dropped it
                    done.set_exception(exc)

            outcome.future.add_done_callback(finished)

        self._hand_over(run)
        try:
            return await asyncio.wrap_future(done)
        except asyncio.CancelledError:
            self._serving.call_soon_threadsafe(lambda: [future.cancel() for future in queued])
            raise

    async def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float | None = None) -> T:
        try:
            result = asyncio.run_coroutine_threadsafe(make(), self._serving)
        except RuntimeError:  # the serving loop is closed
            raise ServingLoopUnresponsive("the serving loop has stopped") from None
        return await _within(asyncio.wrap_future(result), timeout_s)

    def _hand_over(self, run: Callable[[], None]) -> None:
        try:
            self._serving.call_soon_threadsafe(run)
        except RuntimeError:
            raise ServingLoopUnresponsive("the serving loop has stopped") from None


async def _within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    if timeout_s is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        raise ServingLoopUnresponsive(
            f"the serving loop did not answer within {timeout_s:g} s (it is blocked or overloaded)"
        ) from None
