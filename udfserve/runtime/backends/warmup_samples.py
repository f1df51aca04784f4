"""Warm-up samples (config.yaml's, or a version folder's warmup.json) as the arrays a model's
``predict`` takes, checked against its inputs, and repeated to the largest warm-up batch.

A sample was written by hand: what does not fit the model (an input missing or unknown, a string
for a number, a row of another shape) fails the load naming the sample, the input and what was
expected, rather than a framework's error from inside the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec, numpy_dtype, shape_text


def sample_arrays(
    specs: tuple[TensorSpec, ...],
    sample: Mapping[str, Sequence[Any]],
    index: int,
    where: str,
    written_in: str = "config.yaml",
) -> dict[str, np.ndarray]:
    """Sample ``index`` (of the file ``written_in``) as one array per input, of the input's dtype
    (object arrays of UTF-8 ``bytes`` for strings); ``ModelLoadError`` for a sample that does not
    fit ``specs``."""
    expected = [spec.name for spec in specs]
    if sorted(sample) != sorted(expected):
        missing = [name for name in expected if name not in sample]
        unknown = sorted(set(sample) - set(expected))
        raise ModelLoadError(
            f"{where}: warm-up sample {index} of {written_in} names inputs {sorted(sample)}; expected the "
            f"model's inputs {expected} (missing: {missing}, unknown: {unknown})"
        )
    return {spec.name: _array(spec, sample[spec.name], f"{where}: warm-up sample {index}") for spec in specs}


def repeated(sample: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``sample``'s rows repeated in turn to ``rows`` rows: the largest warm-up call."""
    return {name: np.take(array, np.arange(rows) % len(array), axis=0) for name, array in sample.items()}


def _array(spec: TensorSpec, rows: Sequence[Any], where: str) -> np.ndarray:
    what = f"{where} input {spec.name!r} ({spec.dtype}, per-row shape {shape_text(spec.shape)})"
    try:
        written = np.array(rows, dtype=object if spec.dtype == STRING_DTYPE else None)
    except ValueError as exc:
        raise ModelLoadError(f"{what}: its rows are not all of one shape ({exc})") from None
    if spec.dtype == STRING_DTYPE:
        texts = [value for value in written.reshape(-1) if not isinstance(value, str)]
        if texts or written.dtype != object:
            raise ModelLoadError(
                f"{what}: expected strings, in rows of one shape; got {texts[:3] or written.dtype}"
            )
        array = np.empty(written.shape, dtype=object)
        array.reshape(-1)[:] = [value.encode("utf-8") for value in written.reshape(-1)]
    else:
        array = _numbers(spec, written, what)
    shape: tuple[int, ...] = tuple(array.shape[1:])
    fits = len(shape) == len(spec.shape) and all(
        want in (FREE_DIM, got) for want, got in zip(spec.shape, shape, strict=True)
    )
    if not fits:
        raise ModelLoadError(
            f"{what}: its rows are of shape {shape_text(shape)}; expected {shape_text(spec.shape)}"
        )
    return array


def _numbers(spec: TensorSpec, written: np.ndarray, what: str) -> np.ndarray:
    kinds = "biu" if spec.dtype.startswith(("int", "uint")) else "b" if spec.dtype == "bool" else "biuf"
    if written.dtype.kind not in kinds:
        wanted = {"biu": "integers", "b": "true or false", "biuf": "numbers"}[kinds]
        raise ModelLoadError(f"{what}: expected {wanted}; got values of numpy kind {written.dtype}")
    array = written.astype(numpy_dtype(spec.dtype))
    if written.dtype.kind in "iu" and not np.array_equal(array, written):
        raise ModelLoadError(f"{what}: a value does not fit {spec.dtype}")
    return array
