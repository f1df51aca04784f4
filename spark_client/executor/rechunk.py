"""Spark's Arrow batches re-cut into requests of ``rows_per_request`` rows, and the answers cut back.

Spark hands a partition over in batches whose size it chooses (``maxRecordsPerBatch``, the
parquet reader's batch size); the server is most efficient with requests of a steady size. The
``Rechunker`` slices big batches (zero-copy) and joins small ones, remembers the batches it
read, and turns the ordered stream of answers back into one answer per Spark batch, so each
output lines up row for row with its input.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import pyarrow as pa

Carry = TypeVar("Carry")


@dataclass
class Pieces:
    """A Spark batch of ``rows`` rows handed over in pieces, converted as the requests need them.

    The rows are announced first, so the batch's answer waits for all of them however far the
    answers run ahead of the conversion.
    """

    rows: int
    batches: Iterable[pa.RecordBatch]


@dataclass
class _Waiting(Generic[Carry]):
    carry: Carry
    rows: int


def planned_request_rows(
    rows_per_request: int, bytes_per_request: int, bytes_per_row: int | None, max_batch_size: int = 0
) -> int:
    """The rows of one request: ``rows_per_request``, fewer where the server takes fewer at once
    (``max_batch_size``, 0 for no limit) or where rows of a fixed size (``bytes_per_row``; None
    when it varies) would pass ``bytes_per_request``. Never fewer than one row."""
    rows = rows_per_request
    if max_batch_size:
        rows = min(rows, max_batch_size)
    if bytes_per_row:
        rows = min(rows, max(1, bytes_per_request // bytes_per_row))
    return rows


class Rechunker(Generic[Carry]):
    """Use ``requests`` as the input of a predictor and ``answers`` on its output, in the same thread.

    ``carry`` is whatever the caller needs back with each Spark batch's answer (the original
    batch for ``mapInArrow``, nothing for a pandas UDF).
    """

    def __init__(self, rows_per_request: int, max_request_bytes: int, empty_answer: pa.RecordBatch) -> None:
        self._rows_per_request = rows_per_request
        self._max_request_bytes = max_request_bytes
        self._empty_answer = empty_answer
        self._waiting: deque[_Waiting[Carry]] = deque()
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = self._pending_limit = 0
        self._pending_shapes: RowShapes = ()
        """The shapes of the last pending row's list values (``_row_shapes``)."""

    def requests(self, batches: Iterable[tuple[Carry, pa.RecordBatch | Pieces]]) -> Iterator[pa.RecordBatch]:
        """Requests of ``rows_per_request`` rows at most (fewer when too many bytes), never empty.

        A Spark batch is a record batch, or ``Pieces`` read only as far as the requests need:
        a caller that converts a big Spark batch piece by piece holds one request's worth of
        converted rows, not a copy of the whole batch, and still gets one answer for it.
        """
        for carry, item in batches:
            if isinstance(item, Pieces):
                self._waiting.append(_Waiting(carry, item.rows))
                yield from self._cut(item.batches, item.rows)
            else:
                self._waiting.append(_Waiting(carry, item.num_rows))
                yield from self._cut((item,), item.num_rows)
        if self._pending:
            yield from self._fitting(_join(self._pending))
            self._pending, self._pending_rows = [], 0

    def _cut(self, pieces: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
        """The requests that fill up with ``pieces``; what does not fill one waits in ``_pending``."""
        seen = 0
        for batch in pieces:
            seen += batch.num_rows
            if batch.num_rows == 0:
                continue
            limit = self._row_limit(batch)
            if self._pending and (
                self._pending[0].schema != batch.schema
                or limit != self._pending_limit
                or _row_shapes(batch, 0) != self._pending_shapes
            ):
                yield from self._fitting(_join(self._pending))
                self._pending, self._pending_rows = [], 0
            self._pending_limit = limit
            start = 0
            while start < batch.num_rows:
                take = min(limit - self._pending_rows, batch.num_rows - start)
                self._pending.append(batch.slice(start, take))
                self._pending_rows += take
                start += take
                if self._pending_rows == limit:
                    yield from self._fitting(_join(self._pending))
                    self._pending, self._pending_rows = [], 0
            if self._pending:  # the batch's tail waits for the next one
                self._pending_shapes = _row_shapes(batch, batch.num_rows - 1)
        if seen != rows:
            raise ValueError(f"a Spark batch announced {rows} rows but its pieces hold {seen}")

    def answers(self, results: Iterable[pa.RecordBatch]) -> Iterator[tuple[Carry, pa.RecordBatch]]:
        """One answer per Spark batch read by ``requests``, in order, row for row."""
        buffered: list[pa.RecordBatch] = []
        buffered_rows = 0
        for result in results:
            buffered.append(result)
            buffered_rows += result.num_rows
            while self._waiting and self._waiting[0].rows <= buffered_rows:
                waiting = self._waiting.popleft()
                if waiting.rows == 0:
                    yield waiting.carry, self._empty_answer
                    continue
                joined = _join(buffered)
                yield waiting.carry, joined.slice(0, waiting.rows)
                rest = joined.slice(waiting.rows)
                buffered = [rest] if rest.num_rows else []
                buffered_rows = rest.num_rows
        while self._waiting and self._waiting[0].rows == 0:
            yield self._waiting.popleft().carry, self._empty_answer
        if self._waiting or buffered_rows:
            raise RuntimeError(
                f"answers and requests disagree: {buffered_rows} answered rows left over, "
                f"{sum(w.rows for w in self._waiting)} requested rows unanswered"
            )

    def _fitting(self, request: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """``request`` in halves until each holds under half the message limit, or one row.

        ``_row_limit`` goes by a batch's average row: a few rows far larger than the rest can
        gather in one request past the limit, which gRPC refuses to send at all.
        """
        if request.num_rows <= 1 or request.nbytes <= self._max_request_bytes // 2:
            yield request
            return
        half = request.num_rows // 2
        yield from self._fitting(request.slice(0, half))
        yield from self._fitting(request.slice(half))

    def _row_limit(self, batch: pa.RecordBatch) -> int:
        bytes_per_row = max(1, batch.nbytes // max(batch.num_rows, 1))
        # Half the message limit leaves room for the IPC framing and for slices whose buffers
        # are larger than their rows.
        return max(1, min(self._rows_per_request, (self._max_request_bytes // 2) // bytes_per_row))


RowShapes = tuple[tuple[int, ...], ...]


def _row_shapes(batch: pa.RecordBatch, row: int) -> RowShapes:
    """The lengths of ``row``'s list values, per column and nesting level (its first element at
    each level), for the columns whose lengths vary.

    A server takes a free dimension of one length in all the rows of a request: Spark batches
    that each hold rows of one length (text padded to each batch's longest) are joined only where
    their lengths agree, and the rows of each stay valid together.
    """
    shapes = []
    for column in batch.columns:
        if not _varies(column.type):
            continue
        lengths = []
        value = column.slice(row, 1)
        while _is_list(value.type) and len(value) and value.null_count == 0:
            values = value.flatten()
            lengths.append(len(values))
            value = values.slice(0, 1)
        shapes.append(tuple(lengths))
    return tuple(shapes)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _varies(kind: pa.DataType) -> bool:
    """A list type with a variable length at some level."""
    while _is_list(kind):
        if not pa.types.is_fixed_size_list(kind):
            return True
        kind = kind.value_type
    return False


def _join(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
