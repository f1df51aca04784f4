"""Freed memory of large calls handed back to the system (glibc's ``malloc_trim``), now and then.

Why: a unary call of tens of MiB passes through gRPC's receive buffers, the message's bytes, the
parsed request and the model's arrays. Once it is answered glibc keeps what was freed: buffers
below the mmap threshold (the launcher raises it to 32 MiB, and glibc's own threshold grows to
the largest block freed) come from the heap and its arenas, and the launcher's
``MALLOC_TRIM_THRESHOLD_`` keeps up to 1 GiB of them on purpose, so that the next request does
not fault its pages in again. Spread over several arenas, each large call left about 120 MiB
resident (``benchmarks/large_unary_memory.py``). After a call of at least ``min_bytes`` is
answered, ``malloc_trim(0)`` returns the free pages of every arena, at most once every
``min_interval_s`` (a trim asked for sooner runs at the end of the interval, so the last call's
memory goes back too). Small calls never trim: their buffers are the ones worth keeping. Where
the C library is not glibc, nothing is trimmed.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


def _glibc_malloc_trim() -> Callable[[int], int] | None:
    try:
        function = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


class MemoryTrimmer:
    """Trims the process's heap after large calls, rate-limited; owned by the server's event loop."""

    def __init__(
        self,
        min_bytes: int,
        min_interval_s: float = 1.0,
        trim: Callable[[int], int] | None = None,
    ) -> None:
        self.min_bytes = min_bytes
        self.min_interval_s = min_interval_s
        self._trim = trim if trim is not None else _glibc_malloc_trim()
        self._last = -float("inf")
        self._scheduled = False
        self._running = False
        self.trims = 0

    @property
    def enabled(self) -> bool:
        return self.min_bytes > 0 and self._trim is not None

    def call_done(self, size_bytes: int) -> None:
        """A call that held ``size_bytes`` is answered: trim if it was large (now, or at the end
        of the interval)."""
        if not self.enabled or size_bytes < self.min_bytes or self._scheduled:
            return
        loop = asyncio.get_running_loop()
        self._scheduled = True
        wait_s = self._last + self.min_interval_s - time.monotonic()
        if wait_s > 0:
            loop.call_later(wait_s, self._start)
        else:
            loop.call_soon(self._start)

    def _start(self) -> None:
        if self._running:  # the previous trim still runs: it will not see this call's memory
            asyncio.get_running_loop().call_later(self.min_interval_s, self._start)
            return
        self._scheduled = False
        self._running = True
        task = asyncio.get_running_loop().run_in_executor(None, self._run)
        task.add_done_callback(self._finished)

    def _run(self) -> None:
        assert self._trim is not None
        self._last = time.monotonic()  # the interval runs from one trim to the next
        self._trim(0)  # ctypes releases the GIL: the event loop goes on meanwhile

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._running = False
        self.trims += 1
        if task.exception() is not None:
            logger.warning("malloc_trim failed: %s", task.exception())
