"""The warm-up calls every backend makes at load, written once: their inputs, their bound, and
what a failure of one means.

A version is warmed up before it serves, so the first request pays no tracing, compilation or
allocation: one call of one row, and one of the largest batch the model takes. That second call
is sized by ``max_batch_size``, which config.yaml sets: a model of 2^20 rows added 2.1 GB to the
server for its warm-up alone. So the largest warm-up call holds at most ``MAX_INPUT_BYTES`` of
input (fewer rows than ``max_batch_size`` for wide rows or large batches, logged). Larger batches
still run: they allocate at their first call instead.

The inputs are the version folder's samples (``warmup.json``, ``warmup_file``) or config.yaml's
(``warmup: {samples: [...]}``) when either names some, else
synthetic: zeros, empty strings, free dimensions of the backend's guess (1, or the example's).
The warm-up is also a check, and it must not refuse a model that real requests can serve:

- a sample the model refuses fails the load: the user said the model takes it;
- a synthetic call that fails where every value was fitted to the model (float or bool inputs of
  fixed shapes, which any model of those inputs takes) fails the load: the model is broken, and
  a new version that would fail every request must not replace one that serves;
- a synthetic call that fails where a value was guessed (a string input, which a model may parse
  or look up; an integer input, which it may use as an index or id; a free dimension, of a length
  it may not take) is a warning: the model loads and serves cold, and the warning says how to
  give samples. Empty strings are no evidence against a model that casts strings to numbers;
- running out of device memory, or anything that stops the process, is never a warning: a model
  that cannot hold its ``max_batch_size`` would fail its full batches too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np

from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.backends.warmup_samples import repeated, sample_arrays
from udfserve.runtime.errors import DeviceOutOfMemory, ModelLoadError, model_failure
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec
from udfserve.runtime.warmup_config import WarmupConfig

logger = logging.getLogger(__name__)

MAX_INPUT_BYTES = 32 << 20
"""The most input bytes of one warm-up call."""

WarmupInputs = Callable[[int], Mapping[str, np.ndarray]]
"""The model's warm-up inputs of a number of rows (zeros, or what the backend knows it takes)."""


def row_counts(max_batch_size: int, row_bytes: int) -> tuple[int, ...]:
    """The rows of each warm-up call: one, and ``max_batch_size`` within ``MAX_INPUT_BYTES``."""
    largest = min(max_batch_size, max(1, MAX_INPUT_BYTES // max(1, row_bytes)))
    return tuple(sorted({1, largest}))


def guessed_inputs(specs: tuple[TensorSpec, ...]) -> list[str]:
    """The inputs whose synthetic values or lengths the model may not take, each with why."""
    guessed = []
    for spec in specs:
        if spec.dtype == STRING_DTYPE:
            guessed.append(f"{spec.name} (strings: a model may parse or look them up)")
        elif spec.dtype.startswith(("int", "uint")):
            guessed.append(f"{spec.name} (integers: a model may use them as indices or ids)")
        elif FREE_DIM in spec.shape:
            guessed.append(f"{spec.name} (a free dimension: its length is guessed)")
    return guessed


def warm_up(
    model: LoadedModel, inputs_of: WarmupInputs, config: WarmupConfig, max_batch_size: int, where: str
) -> None:
    """Warm ``model`` up as ``config`` says (nothing when disabled); ``ModelLoadError`` naming
    ``where``, the call and the error when a failure fails the load (see the module's rules)."""
    if not config.enabled:
        return
    if config.samples:
        for index, written in enumerate(config.samples):
            sample = sample_arrays(model.inputs, written, index, where, config.samples_from)
            rows = len(next(iter(sample.values())))
            if rows > max_batch_size:
                raise ModelLoadError(
                    f"{where}: warm-up sample {index} of {config.samples_from} has {rows} rows; expected "
                    f"at most max_batch_size ({max_batch_size})"
                )
            _run(
                model,
                _sample_inputs(sample, rows),
                rows,
                max_batch_size,
                where,
                f"sample {index} of {config.samples_from}",
            )
        return
    guessed = guessed_inputs(model.inputs)
    try:
        _run(model, inputs_of, 1, max_batch_size, where, "synthetic")
    except _SyntheticFailure as failed:
        if not guessed or isinstance(failed.failure, DeviceOutOfMemory):
            raise ModelLoadError(
                f"{where}: the warm-up call of {failed.rows} row(s) of zeros failed: {failed.failure}; "
                "expected a model that takes zeros of its declared shapes. Name inputs it takes under "
                "`warmup: {samples: [...]}` in its config.yaml, or `warmup: false` loads it without the "
                "warm-up"
            ) from failed.failure
        logger.warning(
            "%s: loaded without a warm-up: the synthetic call of %d row(s) failed, and its values were "
            "guessed for %s: %s. Name inputs the model takes under `warmup: {samples: [...]}` in its "
            "config.yaml to warm it up and check it at load",
            where,
            failed.rows,
            ", ".join(guessed),
            failed.failure,
        )


def _sample_inputs(sample: dict[str, np.ndarray], rows: int) -> WarmupInputs:
    """The sample as written for its own rows, repeated for the largest call."""
    return lambda count: sample if count == rows else repeated(sample, count)


class _SyntheticFailure(Exception):
    def __init__(self, rows: int, failure: Exception) -> None:
        super().__init__(str(failure))
        self.rows = rows
        self.failure = failure


def _run(
    model: LoadedModel, inputs_of: WarmupInputs, first_rows: int, max_batch_size: int, where: str, kind: str
) -> None:
    """The call of ``first_rows`` rows, then the largest batch within the bound."""
    first = inputs_of(first_rows)
    row_bytes = max(1, sum(_nbytes(array) for array in first.values()) // first_rows)
    largest = row_counts(max_batch_size, row_bytes)[-1]
    if largest < max_batch_size:
        logger.info(
            "%s: warming up with %d rows, not max_batch_size %d: %d bytes a row, at most %d a call",
            where,
            largest,
            max_batch_size,
            row_bytes,
            MAX_INPUT_BYTES,
        )
    for rows in sorted({first_rows, max(first_rows, largest)}):
        try:
            model.predict(first if rows == first_rows else inputs_of(rows))
        except BaseException as exc:
            failure = model_failure(exc, where)  # raises again what stops the process
            if kind == "synthetic":
                raise _SyntheticFailure(rows, failure) from exc
            raise ModelLoadError(
                f"{where}: the warm-up call of {rows} row(s) of {kind} failed: {failure}; expected a "
                "sample the model takes (correct or remove it), or `warmup: false` loads it without "
                "the warm-up"
            ) from exc


def _nbytes(array: np.ndarray) -> int:
    """An array's bytes, a string's own bytes counted (an object array holds only pointers)."""
    if array.dtype == object:
        return array.nbytes + sum(len(value) for value in array.reshape(-1))
    return array.nbytes
