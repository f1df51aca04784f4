"""Requests that wait for room in a model's queue instead of being refused.

The queue is bounded (``queue.RequestQueue``: each application's share of it). A request past its
application's share used to be refused at once with ``QueueFull`` (RESOURCE_EXHAUSTED), and its
client had to guess when to send it again: the Spark client backs off exponentially up to a second.
For a model whose rows cost much (a text model: its whole queue is about a second of work), each
refused request crossed to the server and back for nothing, and was often refused again; the
example text job spent about half of its tasks' time in those waits (docs/benchmarks.md,
section 12). A front end that reads a stream one request at a time can do better: hold the
request here until its application has room, and read nothing more of that stream meanwhile, so
that the client's own window (and HTTP/2 flow control) holds its next requests on its side. The
request is then queued the moment rows leave the queue for a batch, and it crosses once.

- **Bounded**: a stream's reader waits with its request, so at most one request per stream waits
  here; each waits at most ``max_wait_s``, and is then refused with the ``QueueFull`` it would have
  had at once (the client backs off and sends it again, as before). What a shared server holds for
  a client stays bounded by the stream's own bounds plus that one request.
- **Fair shares hold**: a waiting request is admitted by the rule a new one is
  (``RequestQueue.refusal``: its application's share, the whole queue's bound). Each application's
  waiting requests are admitted in their order of arrival, and one application's wait never holds
  another's back; a new request of an application that already has requests waiting waits behind
  them, so that it cannot take the room they wait for.
- A waiting request whose caller went away (its answer cancelled: the stream closed) leaves at
  once; when the batcher stops or breaks, every waiting request is refused
  (``refuse_all``) and none is queued after that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from udfserve.runtime.errors import ServingError
from udfserve.services.model_server.core.batching.answers import set_exception
from udfserve.services.model_server.core.batching.queue import Arrays, RequestQueue, Share
from udfserve.services.model_server.errors import QueueFull

QueueRequest = Callable[[Arrays, int, Share], "asyncio.Future[Arrays]"]
"""Queues a request that was just admitted and returns the future of its outputs (the batcher's)."""
WaitObserver = Callable[[float], None]
"""Hears how long a request waited for room (until it was queued, refused or dropped)."""


@dataclass(eq=False)
class WaitingRequest:
    """A request that found no room: ``answer`` gets its outputs (or its refusal), ``admitted`` is
    done once it left the wait (queued, refused or cancelled), when its stream may read on."""

    inputs: Arrays
    rows: int
    share: Share
    answer: asyncio.Future[Arrays]
    admitted: asyncio.Future[None]
    since_s: float
    timer: asyncio.TimerHandle | None = None


class RoomWaits:
    """The requests of one model waiting for room in its queue, in arrival order."""

    def __init__(self, queue: RequestQueue, queue_request: QueueRequest, observe: WaitObserver) -> None:
        self._queue = queue
        self._queue_request = queue_request
        self._observe = observe
        self._waiting: list[WaitingRequest] = []
        self._pass_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        queue.on_room = self.room_made

    def holds_flow_of(self, share: Share) -> bool:
        """Whether requests of ``share``'s application (its flow in the queue) are waiting."""
        key = self._queue.flow_key(share)
        return any(self._queue.flow_key(waiting.share) == key for waiting in self._waiting)

    def wait(
        self, inputs: Arrays, rows: int, share: Share, max_wait_s: float, refusal: QueueFull
    ) -> WaitingRequest:
        """Hold a request of ``rows`` rows until it fits, for at most ``max_wait_s``; then it is
        refused with ``refusal`` (why it did not fit when it came)."""
        loop = self._loop = asyncio.get_running_loop()
        waiting = WaitingRequest(
            inputs, rows, share, loop.create_future(), loop.create_future(), time.perf_counter()
        )
        waiting.timer = loop.call_later(max_wait_s, self._give_up, waiting, refusal, max_wait_s)
        waiting.answer.add_done_callback(lambda _answer: self._cancelled(waiting))
        self._waiting.append(waiting)
        self.room_made()  # rows may have left in this turn of the loop already
        return waiting

    def room_made(self) -> None:
        """Rows left the queue: look, once the current pass of the dispatcher is over, for waiting
        requests that fit now (scheduled, not run here: see ``RequestQueue.on_room``)."""
        if not self._waiting or self._pass_scheduled or self._loop is None:
            return
        self._pass_scheduled = True
        self._loop.call_soon(self._admit_those_that_fit)

    def refuse_all(self, error: ServingError) -> None:
        """Refuse every waiting request with ``error`` (the batcher stops or broke)."""
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self._leave(request)
            set_exception(request.answer, error)

    def _admit_those_that_fit(self) -> None:
        self._pass_scheduled = False
        queue = self._queue
        blocked: set[str] = set()  # flows whose earliest waiting request does not fit: the later wait
        for request in list(self._waiting):
            if request.answer.done():
                continue
            key = queue.flow_key(request.share)
            if key in blocked or queue.refusal(request.rows, request.share) is not None:
                blocked.add(key)
                continue
            self._waiting.remove(request)
            try:
                queue.admit(request.rows, request.share)
                queued = self._queue_request(request.inputs, request.rows, request.share)
            except Exception as error:  # the batcher could not queue it: that request fails, not the pass
                self._leave(request)
                set_exception(request.answer, error)
                continue
            self._leave(request)
            _forward(queued, request.answer)
            request.inputs = {}

    def _give_up(self, request: WaitingRequest, refusal: QueueFull, max_wait_s: float) -> None:
        if request not in self._waiting:
            return
        self._waiting.remove(request)
        self._leave(request)
        set_exception(
            request.answer,
            QueueFull(f"{refusal.message} (it waited {max_wait_s:g} s for room: the server's --room-wait-s)"),
        )

    def _cancelled(self, request: WaitingRequest) -> None:
        """The request's answer is done; if it was cancelled while waiting, it leaves the wait."""
        if request.answer.cancelled() and request in self._waiting:
            self._waiting.remove(request)
            self._leave(request)

    def _leave(self, request: WaitingRequest) -> None:
        if request.timer is not None:
            request.timer.cancel()
        if not request.admitted.done():
            request.admitted.set_result(None)
        self._observe(time.perf_counter() - request.since_s)


def _forward(queued: asyncio.Future[Arrays], answer: asyncio.Future[Arrays]) -> None:
    """``answer`` gets what ``queued`` gets; cancelling ``answer`` cancels ``queued`` (the queue then
    drops what has not run yet)."""

    def on_queued_done(done: asyncio.Future[Arrays]) -> None:
        if answer.done():
            return
        if done.cancelled():
            answer.cancel()
            return
        error = done.exception()
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(done.result())

    def on_answer_done(done: asyncio.Future[Arrays]) -> None:
        if done.cancelled():
            queued.cancel()

    queued.add_done_callback(on_queued_done)
    answer.add_done_callback(on_answer_done)
