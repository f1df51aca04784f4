"""What the batcher measures, and the one place that hands it to the observer.

The metrics module implements ``BatchObserver`` and, optionally, ``AnswerObserver``,
``MemoryObserver`` and ``RoomObserver``. Every part of the batcher reports through ``Reports``,
which checks once which of them the observer implements and logs an observer that raises instead
of letting it fail the request or the batch it was measuring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from udfserve.services.model_server.core.batching.queue import Chunk

logger = logging.getLogger(__name__)


class BatchObserver(Protocol):
    """Receives the batcher's measurements (the metrics module implements it)."""

    def on_queue_wait(self, model: str, seconds: float) -> None:
        """One queued chunk waited ``seconds`` from being queued to the start of its batch."""

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        """One backend call ran ``rows`` rows from ``requests`` chunks in ``seconds``; it failed
        unless ``succeeded`` (its rows then run again, split or alone)."""


@runtime_checkable
class AnswerObserver(Protocol):
    """Optionally also implemented by an observer: each request the batcher answered."""

    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        """One request got its outputs: ``compute_s`` in the successful backend calls that ran its
        rows (each call once, however many of its pieces it ran), ``queue_s`` the rest of its time
        in the batcher (waiting for its batch, handoffs, failed calls)."""


@runtime_checkable
class MemoryObserver(Protocol):
    """Optionally also implemented by an observer: out-of-memory splits and the batch limit."""

    def on_out_of_memory(self, model: str, rows: int) -> None:
        """A backend call of ``rows`` rows ran out of memory; split in halves when ``rows`` > 1."""

    def on_batch_limit(self, model: str, rows: int) -> None:
        """The batch limit is now ``rows`` (reported at start and on every change)."""


@runtime_checkable
class RoomObserver(Protocol):
    """Optionally also implemented by an observer: requests that waited for room in the queue."""

    def on_room_wait(self, model: str, seconds: float) -> None:
        """A request waited ``seconds`` for room in the queue (``admission.RoomWaits``), until it
        was queued, refused or dropped."""


class Reports:
    """One model's measurements, passed on to what its observer implements; never raises."""

    def __init__(self, model_name: str, observer: BatchObserver | None) -> None:
        self.model_name = model_name
        self._observer = observer
        self._memory_observer = observer if isinstance(observer, MemoryObserver) else None
        self._answer_observer = observer if isinstance(observer, AnswerObserver) else None
        self._room_observer = observer if isinstance(observer, RoomObserver) else None

    def queue_wait(self, seconds: float) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_queue_wait(self.model_name, seconds)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def application_wait(self, observe: Callable[[float], None], seconds: float) -> None:
        """A chunk's wait, to the callback its request gave (its application's series)."""
        try:
            observe(seconds)
        except Exception:
            logger.exception("model '%s': application queue-wait observer failed", self.model_name)

    def batch(self, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_batch(self.model_name, rows, requests, seconds, succeeded)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def answered(self, chunks: list[Chunk]) -> None:
        """One request's chunks were all answered: its time in the batcher, split."""
        if self._answer_observer is None:
            return
        compute_s = sum(chunk.compute_s for chunk in chunks)
        in_batcher_s = time.perf_counter() - chunks[0].queued_at_pc
        try:
            self._answer_observer.on_request_answered(
                self.model_name, max(0.0, in_batcher_s - compute_s), compute_s
            )
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def out_of_memory(self, rows: int) -> None:
        if self._memory_observer is None:
            return
        try:
            self._memory_observer.on_out_of_memory(self.model_name, rows)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def batch_limit(self, rows: int) -> None:
        if self._memory_observer is None:
            return
        try:
            self._memory_observer.on_batch_limit(self.model_name, rows)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)

    def room_wait(self, seconds: float) -> None:
        if self._room_observer is None:
            return
        try:
            self._room_observer.on_room_wait(self.model_name, seconds)
        except Exception:
            logger.exception("model '%s': batch observer failed", self.model_name)
