"""The event loop a model server runs on.

Every request crosses the server's one event loop (gRPC's asyncio layer, the batcher, the
answers), and on a busy node that loop's CPU per request decides how many small requests a
server answers. uvloop (libuv, in C) runs the same asyncio code for less CPU per message than
asyncio's own loop, and so answers more small requests per second (measured: docs/benchmarks.md,
section 6, "uvloop").
uvloop is a server dependency wherever it builds (not on Windows); ``auto`` takes it when it is
importable and asyncio's loop otherwise, and ``asyncio`` keeps the standard loop on purpose.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
"""``--event-loop``: ``auto`` (uvloop when installed), ``uvloop`` (required) or ``asyncio``."""

T = TypeVar("T")


class EventLoopUnavailable(RuntimeError):
    """``--event-loop uvloop`` where uvloop is not installed."""


def resolve(choice: EventLoopChoice) -> Literal["uvloop", "asyncio"]:
    """The loop that ``choice`` means on this machine; raises when a required uvloop is missing."""
    if choice == "asyncio":
        return "asyncio"
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise EventLoopUnavailable(
            "--event-loop uvloop: the uvloop package is not installed here; install udfserve[server] "
            "on Linux or macOS, or use --event-loop auto or asyncio"
        )
    return "uvloop" if installed else "asyncio"


def run(main: Coroutine[Any, Any, T], loop: Literal["uvloop", "asyncio"]) -> T:
    """Run ``main`` to completion on a new loop of the kind ``resolve`` picked."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def running_loop_kind() -> Literal["uvloop", "asyncio"]:
    """Which loop runs the calling coroutine, as metrics and logs name it."""
    loop_type = type(asyncio.get_running_loop())
    return "uvloop" if loop_type.__module__.partition(".")[0] == "uvloop" else "asyncio"
