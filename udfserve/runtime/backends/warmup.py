"""The warm-up calls every backend makes at load, written once, and their bound.

A version is warmed up before it serves, so the first request pays no tracing, compilation or
allocation: one call of one row, and one of the largest batch the model takes. That second call
is sized by ``max_batch_size``, which config.yaml sets: a model of 2^20 rows added 2.1 GB to the
server for its warm-up alone. So the largest warm-up call holds at most ``MAX_INPUT_BYTES`` of
input (fewer rows than ``max_batch_size`` for wide rows or large batches, logged). Larger batches
still run: they allocate at their first call instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np

from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import ModelLoadError, model_failure

logger = logging.getLogger(__name__)

MAX_INPUT_BYTES = 32 << 20
"""The most input bytes of one warm-up call."""

WarmupInputs = Callable[[int], Mapping[str, np.ndarray]]
"""The model's warm-up inputs of a number of rows (zeros, or what the backend knows it takes)."""


def row_counts(max_batch_size: int, row_bytes: int) -> tuple[int, ...]:
    """The rows of each warm-up call: one, and ``max_batch_size`` within ``MAX_INPUT_BYTES``."""
    largest = min(max_batch_size, max(1, MAX_INPUT_BYTES // max(1, row_bytes)))
    return tuple(sorted({1, largest}))


def warm_up(model: LoadedModel, inputs_of: WarmupInputs, max_batch_size: int, where: str) -> None:
    """Run the warm-up calls; ``ModelLoadError`` naming ``where``, the rows and the error when one
    fails (any exception, a framework's panic included), and how to load the model without."""
    one_row = inputs_of(1)
    row_bytes = sum(array.nbytes for array in one_row.values())
    counts = row_counts(max_batch_size, row_bytes)
    if counts[-1] < max_batch_size:
        logger.info(
            "%s: warming up with %d rows, not max_batch_size %d: %d bytes a row, at most %d a call",
            where,
            counts[-1],
            max_batch_size,
            row_bytes,
            MAX_INPUT_BYTES,
        )
    for rows in counts:
        try:
            model.predict(one_row if rows == 1 else inputs_of(rows))
        except BaseException as exc:
            failure = model_failure(exc, where)  # raises again what stops the process
            raise ModelLoadError(
                f"{where}: the warm-up call of {rows} row(s) of zeros failed: {failure}; expected a model "
                "that takes zeros (or empty strings) of its declared shapes; `warmup: false` in its "
                "config.yaml loads it without the warm-up"
            ) from exc
