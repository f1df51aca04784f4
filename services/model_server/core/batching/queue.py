"""The queue of one model: admission, chunks, and the batch the next requests in fair order run in.

Requests from many streams wait in one queue per model, kept as one flow per application (the
Spark application a stream names; requests that name none, KServe clients among them, form one
more). The flows share the device by weighted fair queueing counted in rows (self-clocked fair
queueing): each chunk gets a finish tag, its flow's previous tag (or the queue's virtual time, for
a flow that was idle) plus its rows divided by its flow's weight, and batches take chunks in the
order of their tags. An application with 64 tasks in flight and one with 2 then get rows in the
ratio of their weights while both have requests waiting, not 32 to 1; an application alone gets
the whole device; batches still merge the requests of every application.

- The queue as a whole holds at most twice ``max_rows``, and each application's part of it is
  bounded: its weight's share of that whole among the applications with rows queued, and never
  more than ``max_rows`` (all of ``max_rows`` when alone, as with one queue; each of two of equal
  weight may keep as many rows waiting as alone, so that a busy application's closed loop of
  requests is not refused and resent only because a small one came). A request that would take
  its application past its share is refused whole with ``QueueFull`` (back-pressure; a stream's
  request waits for room instead, ``admission.py``, admitted by ``refusal``'s same rule), while
  the others are still admitted. An application with nothing queued admits any one request, so a
  request larger than its share is delayed, never refused forever.
- At most ``max_flows`` applications are scheduled apart; requests of the ones beyond share one
  more flow, so what a client names cannot grow the scheduler.
- A request larger than the batch limit is cut into chunks of at most that many rows, queued
  together (``answers.whole_request`` answers them in order); it is never refused for its size.
- A request of zero rows is a caller error (``ValueError``): the outputs' per-row shapes are
  unknown without running the model, so callers answer empty batches themselves.
- A batch takes the chunk of the lowest tag and the chunks behind it, in tag order, with the same
  signature (names, dtypes and per-row shapes: free dimensions are never merged) until the next
  would not fit the limit. With one flow this is first in, first out. With batching disabled every
  chunk runs alone, still through the queue and the executor, so that batching on and off can be
  compared under the same load.
- A chunk whose caller went away (its future was cancelled) leaves the queue at once and frees its
  rows; it is passed over until then.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from udfserve.services.model_server.errors import QueueFull

if TYPE_CHECKING:
    from udfserve.services.model_server.observability.spans import RequestTrace

Arrays = dict[str, np.ndarray]


@dataclass(eq=False)
class Chunk:
    """Up to the batch limit's rows of one request, answered through ``future``.

    ``first_row`` is where the chunk starts in its request of ``request_rows`` rows, so that an
    error about one row can name it as the client numbers it. ``request`` numbers the requests,
    so that a batch can tell how many it merged. ``at_once``: the request found the batcher idle
    and starts a batch without waiting for the delay.
    """

    inputs: Arrays
    rows: int
    signature: tuple[Any, ...]
    future: asyncio.Future[Arrays]
    enqueued_at_s: float
    first_row: int = 0
    request_rows: int = 0
    request: int = 0
    at_once: bool = False
    compute_s: float = 0.0
    """Time in the successful backend calls that ran this chunk's rows, so far."""
    queued_at_pc: float = 0.0
    """``time.perf_counter()`` when queued, the clock of the calls' durations (an event loop's
    ``time()`` may be that of the start of its current iteration, as uvloop's is)."""
    flow: str = ""
    """The application whose flow the chunk waits in."""
    tag: float = 0.0
    """Its finish tag: batches take chunks in the order of their tags."""
    on_start: Callable[[float], None] | None = None
    """Told the seconds the chunk waited when its batch starts (the application's queue wait)."""
    trace: RequestTrace | None = None
    """Its request's spans, when it is traced (``observability.tracing``): its batch links to it."""


@dataclass(frozen=True)
class Share:
    """Which flow a request waits in and how much of the device its flow is owed: ``weight`` rows
    for every row of a flow of weight 1. ``on_start``, if any, hears each chunk's queue wait."""

    flow: str = ""
    weight: float = 1.0
    on_start: Callable[[float], None] | None = None
    trace: RequestTrace | None = None
    """The spans of the one request queued with this share, when it is traced."""


UNNAMED = Share()
"""The flow of requests that name no application."""
OVERFLOW_FLOW = "(more applications)"
"""The flow shared by the applications beyond ``max_flows``."""
HARD_LIMIT_FACTOR = 2
"""The whole queue never holds more than this many times ``max_rows``."""


@dataclass(eq=False)
class Flow:
    """The chunks of one application, oldest first (their tags increase), and the rows they hold."""

    key: str
    weight: float
    chunks: deque[Chunk] = field(default_factory=deque)
    rows: int = 0
    last_tag: float = 0.0


def signature(inputs: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """Requests merge only when every array agrees on dtype and per-row shape."""
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(inputs.items()))


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's row count; ``ValueError`` for no arrays, arrays that disagree, or no rows."""
    if not inputs:
        raise ValueError("a request needs at least one input array")
    arrays = iter(inputs.values())
    rows = len(next(arrays))
    if any(len(array) != rows for array in arrays):
        counts = {name: len(array) for name, array in inputs.items()}
        raise ValueError(f"input arrays differ in row count: {counts}")
    if rows == 0:
        raise ValueError("empty request: callers answer zero-row requests without queuing them")
    return rows


class RequestQueue:
    """The chunks waiting for a batch, one flow per application, and the rows they hold.

    ``on_cancelled`` is called after a cancelled chunk left the queue (a drain may be waiting for
    the queue to empty).
    """

    def __init__(
        self, model_name: str, max_rows: int, on_cancelled: Callable[[], None], max_flows: int = 64
    ) -> None:
        self.model_name = model_name
        self.max_rows = max_rows
        self.max_flows = max_flows
        self.flows: dict[str, Flow] = {}
        """The applications with chunks queued (a flow leaves once empty)."""
        self.rows = 0
        """Rows waiting, not counting the batches running."""
        self.requests = 0
        """Requests admitted so far: the number of the last one."""
        self.virtual_time = 0.0
        """The highest tag taken into a batch: where the tags of a flow that was idle start."""
        self._on_cancelled = on_cancelled
        self.on_room: Callable[[], None] | None = None
        """Told when rows left the queue (a batch took them, or their caller went away): a request
        waiting for room may fit now (``admission.RoomWaits``). Called inside the dispatcher's
        pass, so it must only schedule its work."""

    def __bool__(self) -> bool:
        return self.rows > 0

    @property
    def chunks(self) -> list[Chunk]:
        """Every chunk waiting, in the order batches would take them."""
        return list(self._in_tag_order())

    def oldest(self) -> Chunk:
        """The chunk that has waited longest (its flow's first; ``IndexError`` when empty)."""
        heads = [flow.chunks[0] for flow in self.flows.values() if flow.chunks]
        if not heads:
            raise IndexError("the queue is empty")
        return min(heads, key=attrgetter("enqueued_at_s"))

    def flow_key(self, share: Share) -> str:
        """The flow a request of ``share`` waits in: its own, or the shared one past ``max_flows``."""
        if share.flow in self.flows or len(self.flows) < self.max_flows:
            return share.flow
        return OVERFLOW_FLOW

    def admit(self, rows: int, share: Share = UNNAMED) -> None:
        """Number one more request of ``rows`` rows of ``share``'s application, or refuse it with
        ``QueueFull``: past its application's share of the queue, or past the whole queue's bound."""
        refusal = self.refusal(rows, share)
        if refusal is not None:
            raise refusal
        self.requests += 1

    def refusal(self, rows: int, share: Share = UNNAMED) -> QueueFull | None:
        """Why a request of ``rows`` rows of ``share``'s application cannot be admitted now (its
        application's share, or the whole queue's bound, is full), or None when it can."""
        key = self.flow_key(share)
        flow = self.flows.get(key)
        held = flow.rows if flow is not None else 0
        if held > 0:
            weight = flow.weight if flow is not None else share.weight
            active = sum(f.weight for f in self.flows.values() if f.rows)
            whole = HARD_LIMIT_FACTOR * self.max_rows
            bound = min(self.max_rows, whole * weight / active) if active else self.max_rows
            if held + rows > bound:
                waiting = sum(1 for f in self.flows.values() if f.rows)
                if waiting == 1:
                    return QueueFull(
                        f"model '{self.model_name}': queue full: {held} rows queued, this request has "
                        f"{rows}, the limit is {self.max_rows} rows; retry later"
                    )
                whose = f"application {key!r}" if key else "requests naming no application"
                return QueueFull(
                    f"model '{self.model_name}': queue full for {whose}: it holds {held} rows queued, this "
                    f"request has {rows}, its share is {int(bound)} of the {whole} rows of the queue "
                    f"while {waiting} applications wait; retry later"
                )
        if self.rows > 0 and self.rows + rows > HARD_LIMIT_FACTOR * self.max_rows:
            return QueueFull(
                f"model '{self.model_name}': queue full: {self.rows} rows queued, this request has {rows}, "
                f"the limit is {HARD_LIMIT_FACTOR * self.max_rows} rows over all applications; retry later"
            )
        return None

    def put(
        self,
        inputs: Arrays,
        rows: int,
        limit: int,
        loop: asyncio.AbstractEventLoop,
        now_s: float,
        at_once: bool,
        share: Share = UNNAMED,
    ) -> list[Chunk]:
        """Queue the request just admitted, in chunks of at most ``limit`` rows, in its flow."""
        queued_at_pc = time.perf_counter()
        request_signature = signature(inputs)
        request = self.requests
        if rows <= limit:
            chunks = [
                Chunk(inputs, rows, request_signature, loop.create_future(), now_s, 0, rows, request, at_once)
            ]
        else:
            chunks = [
                Chunk(
                    {name: array[start : start + limit] for name, array in inputs.items()},
                    min(limit, rows - start),
                    request_signature,
                    loop.create_future(),
                    now_s,
                    start,
                    rows,
                    request,
                    at_once,
                )
                for start in range(0, rows, limit)
            ]
        key = self.flow_key(share)
        flow = self.flows.get(key)
        if flow is None:
            weight = share.weight if key == share.flow else UNNAMED.weight
            flow = self.flows[key] = Flow(key, weight, last_tag=self.virtual_time)
        for chunk in chunks:
            flow.last_tag = max(flow.last_tag, self.virtual_time) + chunk.rows / flow.weight
            chunk.tag, chunk.flow, chunk.on_start, chunk.trace = (
                flow.last_tag,
                key,
                share.on_start,
                share.trace,
            )
            chunk.queued_at_pc = queued_at_pc
            chunk.future.add_done_callback(self._on_chunk_done)
        flow.chunks.extend(chunks)
        flow.rows += rows
        self.rows += rows
        return chunks

    def _in_tag_order(self) -> Iterator[Chunk]:
        flows = [flow.chunks for flow in self.flows.values() if flow.chunks]
        if len(flows) == 1:
            return iter(flows[0])
        return heapq.merge(*flows, key=attrgetter("tag"))

    def candidates(self, limit: int, merge: bool) -> tuple[list[Chunk], bool]:
        """The batch the chunk of the lowest tag would run in now, and whether it can still grow.
        Chunks cancelled whose callback has not run yet are passed over. Without ``merge``
        (batching disabled) that chunk runs alone."""
        head: Chunk | None = None
        batch: list[Chunk] = []
        rows = 0
        for chunk in self._in_tag_order():
            if chunk.future.done():
                continue
            if head is None:
                head = chunk
                if not merge:
                    return [chunk], False
            elif chunk.signature != head.signature:
                continue
            # The head always runs, even when queued before the limit dropped below its size.
            if batch and rows + chunk.rows > limit:
                return batch, False
            batch.append(chunk)
            rows += chunk.rows
        return batch, rows < limit

    def take(self, batch: list[Chunk]) -> None:
        """Remove the chunks of a batch that starts; their cancellation is the runner's now."""
        for chunk in batch:
            self._remove(chunk)
            chunk.future.remove_done_callback(self._on_chunk_done)
            self.virtual_time = max(self.virtual_time, chunk.tag)
        self._room_made()

    def clear(self) -> None:
        """Forget every chunk (their callers were answered otherwise)."""
        self.flows.clear()
        self.rows = 0

    def _remove(self, chunk: Chunk) -> None:
        flow = self.flows[chunk.flow]
        if flow.chunks[0] is chunk:
            flow.chunks.popleft()
        else:
            flow.chunks.remove(chunk)
        flow.rows -= chunk.rows
        self.rows -= chunk.rows
        if not flow.chunks:
            del self.flows[chunk.flow]

    def _on_chunk_done(self, future: asyncio.Future[Arrays]) -> None:
        """A chunk cancelled while queued leaves the queue at once, freeing its rows (the callback
        is removed when a chunk is taken into a batch)."""
        for flow in self.flows.values():
            for chunk in flow.chunks:
                if chunk.future is future:
                    self._remove(chunk)
                    self._on_cancelled()
                    self._room_made()
                    return

    def _room_made(self) -> None:
        if self.on_room is not None:
            self.on_room()
