"""The batch limit: the most rows one backend call runs, lowered when the device runs out of memory.

A backend reports out of device memory by raising ``DeviceOutOfMemory`` (the TensorFlow backend
maps the framework's own resource-exhausted error to it); the call is then split in halves
(``recovery``). When a call ran out of memory and no row of it fails alone, its size is to blame:
the limit (initially ``max_batch_size``) drops to the largest part of it that fitted, so later
batches do not rediscover the limit with a failed call each (a failed allocation can cost seconds:
TensorFlow's BFC allocator retries for up to 10 s before giving up). A call that failed because of
a row too big to fit alone lowers nothing: one such row must not throttle everyone else's batches.

The limit recovers additively: after ``LIMIT_RECOVERY_CALLS`` successful calls of the full limit
in a row it grows by ``max_batch_size // LIMIT_RECOVERY_STEPS`` (at least one row), up to
``max_batch_size``; an out-of-memory call resets that count. Calls smaller than the limit prove
nothing about it and do not count, so under light traffic the limit stays where it is, which
costs nothing then.
"""

from __future__ import annotations

import logging

from udfserve.services.model_server.core.batching.observers import Reports

logger = logging.getLogger(__name__)

LIMIT_RECOVERY_CALLS = 64
"""Successful calls of the full batch limit, in a row, before the limit grows one step."""
LIMIT_RECOVERY_STEPS = 16
"""The limit grows by ``max_batch_size // LIMIT_RECOVERY_STEPS`` rows per step (at least one)."""


class RowLimit:
    """The batch limit of one model, told the outcome of every backend call.

    ``rows`` is read on every request and batch; only this object changes it, and every change
    (and ``report()`` at start) goes to the observer's ``on_batch_limit``.
    """

    def __init__(self, max_batch_size: int, reports: Reports) -> None:
        self.rows = max_batch_size
        self.max_rows = max_batch_size
        self._reports = reports
        self._full_calls_at_limit = 0

    def report(self) -> None:
        """Tell the observer the limit as it is now."""
        self._reports.batch_limit(self.rows)

    def on_success(self, rows: int) -> None:
        """A call of ``rows`` rows succeeded: one more full call towards the next step up."""
        if self.rows >= self.max_rows or rows < self.rows:
            return
        self._full_calls_at_limit += 1
        if self._full_calls_at_limit < LIMIT_RECOVERY_CALLS:
            return
        self._full_calls_at_limit = 0
        step = max(1, self.max_rows // LIMIT_RECOVERY_STEPS)
        self.rows = min(self.max_rows, self.rows + step)
        logger.info("model '%s': batch limit raised to %d rows", self._reports.model_name, self.rows)
        self.report()

    def on_out_of_memory(self, rows: int) -> None:
        """A call of ``rows`` rows ran out of memory: the recovery starts counting again."""
        logger.warning(
            "model '%s': out of memory on a call of %d rows; %s",
            self._reports.model_name,
            rows,
            "splitting it in halves" if rows > 1 else "a single row does not fit",
        )
        self._reports.out_of_memory(rows)
        self._full_calls_at_limit = 0

    def on_split(self, fitted: list[int], row_too_big: bool) -> None:
        """A call that ran out of memory was split into calls of which those of ``fitted`` rows
        succeeded. Unless a single row failed alone (``row_too_big``), the size explains the
        failure: later batches start from the largest part that fitted."""
        if fitted and not row_too_big:
            self._lower(max(fitted))

    def _lower(self, rows: int) -> None:
        if rows >= self.rows:
            return
        self.rows = rows
        self._full_calls_at_limit = 0
        logger.warning("model '%s': batch limit lowered to %d rows", self._reports.model_name, rows)
        self.report()
