"""A time bound on each model call, and the means a backend gives to stop a call that ran past it.

A model's call can run for ever on input it was never meant for (an ONNX ``Loop`` whose trip count
comes from the input), and a shared server must not let one request hold a core and its model's
inference thread for good. The server runs every backend call inside ``CallWatch.bounded``; the
one watchdog thread of the process notices a call past its bound and:

1. calls the stop the backend registered for that call (``on_overrun``, from inside ``predict``,
   in the calling thread). ONNX Runtime has one (``RunOptions.terminate``): its call then raises
   and the batch fails ``ModelCallTimeout`` (DEADLINE_EXCEEDED); the model goes on serving.
   TensorFlow and PyTorch have none a caller can use on a running graph or program, so a call of
   theirs cannot be stopped from outside;
2. when the call has not returned ``stuck_after_s`` after its bound (it could not be stopped),
   calls the caller's ``on_stuck``: the server then fails what the model holds UNAVAILABLE, stops
   serving and exits for its supervisor to start a fresh process, within its exit timeout (a
   thread running native code cannot be ended any other way).

The watchdog sleeps until the earliest deadline it knows of, and a call wakes it only when its own
deadline comes sooner: back-to-back calls (a busy model) cost a lock and a set entry each, not a
thread switch each. A watchdog woken at the deadline of a call that finished in time looks again
and sleeps until the next deadline, or for good once no call is watched: an idle server wakes no
thread beyond that one look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

STUCK_AFTER_S = 5.0
"""How long a call may go on after its bound (and its stop, where the backend has one) before it
is taken for one that cannot be stopped."""


@dataclass(eq=False)
class BoundedCall:
    """One call under watch: its deadline, its backend's stop, and what became of it."""

    deadline_s: float
    bound_s: float
    on_stuck: Callable[[str], None] | None
    stop: Callable[[], None] | None = None
    overran: bool = False
    """The call ran past its bound (its stop, if any, was called)."""
    reported_stuck: bool = False
    finished: bool = field(default=False, repr=False)


_current = threading.local()
"""The ``BoundedCall`` of the call running in this thread, for ``on_overrun``."""


def on_overrun(stop: Callable[[], None]) -> None:
    """Register how to stop the call running in this thread (a backend calls this in ``predict``,
    before the framework's call); a no-op outside a bounded call (the CPU fallback, a script)."""
    call: BoundedCall | None = getattr(_current, "call", None)
    if call is not None:
        call.stop = stop


class CallWatch:
    """The process's watchdog of bounded calls; its thread starts with the first bounded call."""

    def __init__(self, stuck_after_s: float = STUCK_AFTER_S) -> None:
        self._stuck_after_s = stuck_after_s
        self._calls: set[BoundedCall] = set()
        self._lock = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._wakes_at_s = float("inf")
        """When the watchdog wakes by itself (infinity: only when notified); under the lock."""

    @contextmanager
    def bounded(self, bound_s: float, on_stuck: Callable[[str], None] | None = None) -> Iterator[BoundedCall]:
        """Watch the call made inside the block; a ``bound_s`` of 0 sets no deadline (the call can
        still be stopped by ``stop_all``)."""
        deadline_s = time.monotonic() + bound_s if bound_s > 0 else float("inf")
        call = BoundedCall(deadline_s, bound_s, on_stuck)
        with self._lock:
            self._calls.add(call)
            if bound_s > 0:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="call-watchdog", daemon=True)
                    self._thread.start()
                elif deadline_s < self._wakes_at_s:
                    self._wakes_at_s = deadline_s  # the watchdog looks at its calls again, and sleeps less
                    self._lock.notify()
        _current.call = call
        try:
            yield call
        finally:
            _current.call = None
            with self._lock:
                call.finished = True
                self._calls.discard(call)

    def stop_all(self) -> int:
        """Stop every watched call that its backend can stop (a server whose grace period is over:
        what still runs would only hold its exit); returns how many were asked to stop."""
        with self._lock:
            stops = [call.stop for call in self._calls if call.stop is not None]
        for stop in stops:
            try:
                stop()
            except Exception:
                logger.exception("stopping a model call failed")
        return len(stops)

    def _watch(self) -> None:
        while True:
            with self._lock:
                now_s = time.monotonic()
                due = [call for call in self._calls if self._next_time(call) <= now_s]
                times = [self._next_time(call) for call in self._calls if call not in due]
                waits = [moment - now_s for moment in times if moment != float("inf")]
                if not due:
                    self._wakes_at_s = now_s + min(waits) if waits else float("inf")
                    self._lock.wait(timeout=min(waits) if waits else None)
                    continue
                self._wakes_at_s = now_s  # acting on its due calls: it looks again when done
            for call in due:  # outside the lock: a stop may take its time
                self._act(call)

    def _next_time(self, call: BoundedCall) -> float:
        if call.deadline_s == float("inf"):
            return call.deadline_s
        if not call.overran:
            return call.deadline_s
        if call.reported_stuck:
            return float("inf")
        return call.deadline_s + self._stuck_after_s

    def _act(self, call: BoundedCall) -> None:
        if call.finished:
            return
        if not call.overran:
            call.overran = True
            stop = call.stop
            logger.warning(
                "a model call ran past its bound of %g s; %s",
                call.bound_s,
                "stopping it" if stop is not None else "its backend cannot stop it",
            )
            if stop is not None:
                try:
                    stop()
                except Exception:
                    logger.exception("stopping a model call past its bound failed")
            return
        call.reported_stuck = True
        if call.on_stuck is not None:
            call.on_stuck(
                f"a model call ran past its bound of {call.bound_s:g} s and did not stop within "
                f"{self._stuck_after_s:g} s after"
            )


WATCH = CallWatch()
"""The one watchdog of this process's model calls."""
