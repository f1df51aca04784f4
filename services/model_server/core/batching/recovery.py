"""The rare batches that need more than one backend call, run in a task.

- Chunks queued before the batch limit dropped run in calls of the limit as it is now.
- A call that raises ``DeviceOutOfMemory`` is split in halves, each half run on its own and split
  again if it still does not fit, down to one row; every row is still answered exactly once and
  in order. A single row that does not fit alone fails its request with ``DeviceOutOfMemory``
  (RESOURCE_EXHAUSTED) naming the model and the row. ``RowLimit`` learns of every outcome.
- When a merged call fails, each request that shared it is run again alone, so only the bad one
  fails and the requests merged with it still get their answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from udfserve.log_text import clip
from udfserve.runtime.errors import DeviceOutOfMemory, InvalidInput, ServingError
from udfserve.services.model_server.core.batching.answers import (
    as_serving_error,
    joined,
    resolve,
    set_exception,
)
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Arrays, Chunk
from udfserve.services.model_server.core.batching.row_limit import RowLimit

logger = logging.getLogger(__name__)


@dataclass
class CallResult:
    """One backend call's outputs or error, and how long it took."""

    outputs: Arrays | None
    error: BaseException | None
    seconds: float


@dataclass
class Piece:
    """Rows ``start:stop`` of a batch, run in one backend call: their outputs or its error."""

    start: int
    stop: int
    outputs: Arrays | None
    error: BaseException | None
    seconds: float = 0.0
    """The call's duration."""


CallFn = Callable[[Arrays, int, int], Awaitable[CallResult]]
"""One backend call of (inputs, rows, requests merged), reported to the observer."""


def _unfittable(piece: Piece) -> bool:
    """A single row that ran out of memory alone: its size, not the batch's, is at fault."""
    return isinstance(piece.error, DeviceOutOfMemory) and piece.stop - piece.start == 1


def _parts_of_pieces(pieces: list[Piece], start: int, stop: int) -> list[Arrays]:
    """The outputs of rows ``start:stop`` of a batch, one part per successful piece covering them."""
    parts = []
    for piece in pieces:
        assert piece.outputs is not None
        lo, hi = max(start, piece.start) - piece.start, min(stop, piece.stop) - piece.start
        parts.append({name: array[lo:hi] for name, array in piece.outputs.items()})
    return parts


class Recovery:
    """Runs a batch in as many calls as it takes and answers each of its chunks."""

    def __init__(self, model_name: str, call: CallFn, limit: RowLimit, reports: Reports) -> None:
        self.model_name = model_name
        self._call = call
        self._limit = limit
        self._reports = reports

    async def run(self, chunks: list[Chunk], inputs: Arrays, rows: int, first: CallResult | None) -> None:
        """The batch's rows in calls of the batch limit, splitting on out-of-memory, and each
        request of a failed merged call again alone; ``first`` is the failed whole-batch call."""
        bounds = np.cumsum([0, *(chunk.rows for chunk in chunks)])
        pieces = await self._run_range(inputs, bounds, 0, rows, first)
        isolate = self._answer(chunks, pieces)
        if isolate:
            logger.warning(
                "model '%s': a merged batch of %d requests failed (%s); running each alone",
                self.model_name,
                len(isolate),
                clip(str(next(piece.error for piece in pieces if piece.error is not None)), 500),
            )
            for chunk in isolate:
                if not chunk.future.done():
                    self._answer([chunk], await self._run_rows([chunk]))

    def _answer(self, chunks: list[Chunk], pieces: list[Piece]) -> list[Chunk]:
        """Answer every chunk from the pieces covering its rows; return the chunks that share a
        failed call with other chunks and must be run alone to tell which of them is at fault."""
        isolate = []
        start = 0
        for chunk in chunks:
            stop = start + chunk.rows
            covering = [piece for piece in pieces if piece.start < stop and piece.stop > start]
            failed = next((piece for piece in covering if piece.error is not None), None)
            if failed is None:
                try:
                    parts = _parts_of_pieces(covering, start, stop)
                    outputs = joined(self.model_name, parts, chunk.request_rows, self._limit.rows)
                except InvalidInput as error:
                    set_exception(chunk.future, error)
                else:
                    resolve(chunk, outputs, sum(p.seconds for p in covering), self._reports)
            elif len(chunks) > 1 and (failed.start < start or failed.stop > stop):
                isolate.append(chunk)
            else:
                assert failed.error is not None
                set_exception(chunk.future, self._chunk_error(chunk, failed, start))
            start = stop
        return isolate

    def _chunk_error(self, chunk: Chunk, failed: Piece, chunk_start: int) -> ServingError:
        error = failed.error
        if isinstance(error, DeviceOutOfMemory) and failed.stop - failed.start == 1:
            row = chunk.first_row + failed.start - chunk_start
            return DeviceOutOfMemory(
                f"model '{self.model_name}': out of memory on a single row: row {row} of the request's "
                f"{chunk.request_rows} rows does not fit even alone (its batch was split down to one "
                f"row); retry later or on another device. Backend: {error.message}"
            )
        assert error is not None
        return as_serving_error(self.model_name, error)

    async def _run_rows(self, chunks: list[Chunk]) -> list[Piece]:
        """Run the chunks' rows as one batch; the pieces returned cover every row, in order."""
        if len(chunks) == 1:
            inputs = chunks[0].inputs
        else:
            inputs = {name: np.concatenate([c.inputs[name] for c in chunks]) for name in chunks[0].inputs}
        bounds = np.cumsum([0, *(chunk.rows for chunk in chunks)])
        return await self._run_range(inputs, bounds, 0, int(bounds[-1]))

    async def _run_range(
        self, inputs: Arrays, bounds: np.ndarray, start: int, stop: int, first: CallResult | None = None
    ) -> list[Piece]:
        """Rows ``start:stop`` in one call, or in calls of the batch limit when they exceed it
        (chunks queued before the limit dropped); on out-of-memory, the two halves, recursively.
        ``first``, when given, is the outcome of the call of exactly these rows, already made."""
        rows = stop - start
        limit = self._limit
        if rows > limit.rows:
            pieces: list[Piece] = []
            while start < stop:  # the limit is read again before each call: it may drop meanwhile
                end = min(start + limit.rows, stop)
                pieces.extend(await self._run_range(inputs, bounds, start, end))
                start = end
            return pieces
        whole = start == 0 and stop == int(bounds[-1])
        part = inputs if whole else {name: array[start:stop] for name, array in inputs.items()}
        first_chunk = int(np.searchsorted(bounds, start, side="right")) - 1
        last_chunk = int(np.searchsorted(bounds, stop, side="left")) - 1
        result = first if first is not None else await self._call(part, rows, last_chunk - first_chunk + 1)
        if result.error is None:
            limit.on_success(rows)
            return [Piece(start, stop, result.outputs, None, result.seconds)]
        if not isinstance(result.error, DeviceOutOfMemory):
            return [Piece(start, stop, None, result.error)]
        limit.on_out_of_memory(rows)
        if rows == 1:
            return [Piece(start, stop, None, result.error)]
        middle = start + (rows + 1) // 2
        pieces = [
            *await self._run_range(inputs, bounds, start, middle),
            *await self._run_range(inputs, bounds, middle, stop),
        ]
        limit.on_split(
            fitted=[piece.stop - piece.start for piece in pieces if piece.error is None],
            row_too_big=any(_unfittable(piece) for piece in pieces),
        )
        return pieces
