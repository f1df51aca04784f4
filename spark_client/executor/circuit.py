"""A circuit breaker per server address, kept by each Python worker process across its tasks.

After a server fails (no connection, a broken stream, a missed deadline) its circuit opens: the
batches that follow go to another server or the CPU fallback without trying it again, so a dead
server costs one failure rather than a connect timeout per batch. Once ``reset_s`` has passed,
the next batch probes the server (half-open): if it connects, the circuit closes and the
partition goes back to the server; if not, the circuit opens again for another ``reset_s``.

A circuit belongs to the server that failed, not only to its address: a target's circuit opened
by one server (``server``, its identity in the node's discovery file) is closed for the server
announced in its place. A node supervisor restarts a server on the same unix socket and a new
TCP port; without this, the socket would stay shunned for ``reset_s`` while the new, untried
port took the partition, without shared memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]


@dataclass
class _Open:
    since_s: float
    reason: str
    server: str | None


class CircuitBreakers:
    """The circuits of one process, by target; ``clock`` is injectable for tests.

    ``server`` names the process behind a target (None when nothing does, as for a configured
    address); a circuit opened with one ``server`` is closed when asked about another.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def _opened(self, target: str, server: str | None) -> _Open | None:
        """The open circuit of ``target`` for ``server``; one left by another server is forgotten."""
        with self._lock:
            opened = self._open.get(target)
            if opened is not None and opened.server != server:
                del self._open[target]  # a server that is gone: its successor starts closed
                return None
            return opened

    def state(self, target: str, reset_s: float, server: str | None = None) -> CircuitState:
        opened = self._opened(target, server)
        if opened is None:
            return "closed"
        return "half_open" if self._clock() >= opened.since_s + reset_s else "open"

    def allows(self, target: str, reset_s: float, server: str | None = None) -> bool:
        """True when a batch may be sent to ``target``: closed, or open long enough to probe."""
        return self.state(target, reset_s, server) != "open"

    def failed(self, target: str, reason: str, server: str | None = None) -> None:
        with self._lock:
            self._open[target] = _Open(self._clock(), reason, server)

    def succeeded(self, target: str) -> None:
        with self._lock:
            self._open.pop(target, None)

    def reason(self, target: str, server: str | None = None) -> str | None:
        """Why the circuit of ``target`` is open, if it is."""
        opened = self._opened(target, server)
        return opened.reason if opened else None

    def reopens_at(self, target: str, reset_s: float, server: str | None = None) -> float:
        """When ``target`` may be probed next (the clock's time; now or earlier when it may be now)."""
        opened = self._opened(target, server)
        return opened.since_s + reset_s if opened else self._clock()

    def now(self) -> float:
        return self._clock()


BREAKERS = CircuitBreakers()
"""This worker process's circuits; Spark reuses Python workers, so they outlive a task."""
