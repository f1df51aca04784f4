"""Calling a traced TensorFlow graph with as little Python and as few copies as TensorFlow allows.

``graph_caller`` picks the graph's own flat call over the public ``ConcreteFunction.__call__``
once ``VerifiedCall`` has seen both answer alike; ``to_tensor`` and ``to_numpy`` hand arrays to
TensorFlow and take its outputs back through DLPack where the memory allows it. The TensorFlow
backend (``tensorflow.py``) calls every batch through these.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)


GraphCall = Callable[[list[tf.Tensor]], Mapping[str, tf.Tensor]]
"""Runs the traced graph on one tensor per input, in the inputs' order; outputs by name."""


def graph_caller(concrete: Any) -> VerifiedCall:
    """The cheapest call of the traced graph this TensorFlow offers, checked on the first call.

    ``ConcreteFunction.__call__`` binds its arguments to the traced signature, looks for a
    gradient tape and packs the outputs in Python: about 150 us per call here, half the cost of
    an 8-row call of the example MLP, all of it holding the GIL that the event loop needs. The
    graph's own flat call (the inputs, then the captured variables, in; the outputs packed by
    the function's own record of their structure) skips that; no tape ever watches a serving
    thread. It is a private interface of TensorFlow's, so where it is missing the public call
    serves, and ``VerifiedCall`` checks that the two agree before trusting it.
    """

    def public(tensors: list[tf.Tensor]) -> Mapping[str, tf.Tensor]:
        return concrete(*tensors)

    inference = getattr(concrete, "_inference_function", None)
    call_flat = getattr(inference, "call_flat", None)
    pack_output = getattr(getattr(inference, "function_type", None), "pack_output", None)
    if call_flat is None or pack_output is None or not hasattr(concrete, "captured_inputs"):
        logger.info("tensorflow %s: no flat call of a traced graph; the public call serves", tf.__version__)
        return VerifiedCall(None, public)

    def flat(tensors: list[tf.Tensor]) -> Mapping[str, tf.Tensor]:
        # The outputs are packed by TensorFlow's own record of their structure, and the captured
        # variables read on every call, as the public call does (deferred captures included).
        return pack_output(call_flat(*tensors, *concrete.captured_inputs))

    return VerifiedCall(flat, public)


class VerifiedCall:
    """``fast`` once it has answered one call exactly as ``public`` does (names, dtypes, shapes,
    values), else ``public`` for good: a TensorFlow whose private call behaves differently costs
    speed, never a wrong answer. Safe from several threads: until one call has decided, calls
    take the public path. The deciding call (the warm-up at load, unless warm-up is off) runs
    the graph twice; a model with state of its own (a counter variable) sees it once more."""

    def __init__(self, fast: GraphCall | None, public: GraphCall) -> None:
        self._fast = fast
        self._public = public
        self._chosen: GraphCall | None = public if fast is None else None
        self._deciding = threading.Lock()

    @property
    def uses_fast_call(self) -> bool | None:
        """True or False once decided; None before the first call."""
        if self._chosen is None:
            return None
        return self._chosen is self._fast

    def __call__(self, tensors: list[tf.Tensor]) -> Mapping[str, tf.Tensor]:
        chosen = self._chosen
        if chosen is not None:
            return chosen(tensors)
        expected = self._public(tensors)
        if self._fast is not None and self._deciding.acquire(blocking=False):
            try:
                if self._chosen is None:
                    self._chosen = self._fast if self._agrees(tensors, expected) else self._public
            finally:
                self._deciding.release()
        return expected

    def _agrees(self, tensors: list[tf.Tensor], expected: Mapping[str, tf.Tensor]) -> bool:
        assert self._fast is not None
        try:
            got = self._fast(tensors)
            same = set(got) == set(expected) and all(
                got[name].dtype == expected[name].dtype and _same_values(got[name], expected[name])
                for name in expected
            )
        except Exception as exc:  # any failure of the private call means: do not use it
            logger.info("flat call of the traced graph failed (%s); the public call serves", exc)
            return False
        if not same:
            logger.info("flat call of the traced graph disagrees with the public one; the public call serves")
        return same


def _same_values(got: tf.Tensor, expected: tf.Tensor) -> bool:
    """Equal shapes and values, NaN equal to NaN (a model may well answer NaN to a warm-up's zeros)."""
    got_array, expected_array = got.numpy(), expected.numpy()
    return got_array.shape == expected_array.shape and bool(
        np.array_equal(got_array, expected_array, equal_nan=got_array.dtype.kind in "fc")
    )


_DLPACK_KINDS = frozenset("biuf")  # bool, integers, floats: what DLPack carries
TENSOR_ALIGNMENT_BYTES = 64
"""TensorFlow aborts the process (``Check failed: IsAligned()``) when an op reads a tensor whose
memory is less aligned than its allocator's 64 bytes; only such arrays are shared with it."""


def to_tensor(array: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """``array`` as a tensor of ``dtype``, sharing its memory where it can.

    ``tf.convert_to_tensor`` copies every array, 16 MiB in about 3 ms here: as much as the rest of
    a large request's path. A writable numeric array of the right dtype (a merged batch, or a
    request read in place from shared memory) goes through DLPack instead, without a copy; the
    tensor lives for the call only. Read-only arrays (views of a gRPC message) cannot be exported,
    and TensorFlow cannot read memory less aligned than its own: those are copied as before."""
    if (
        array.flags.writeable
        and array.flags.c_contiguous
        and array.ctypes.data % TENSOR_ALIGNMENT_BYTES == 0
        and array.dtype.kind in _DLPACK_KINDS
        and array.dtype == dtype.as_numpy_dtype
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
            pass  # a layout DLPack or TensorFlow refuses: copy it
    return tf.convert_to_tensor(array, dtype=dtype)


def to_numpy(tensor: tf.Tensor) -> np.ndarray:
    """The host array of an output tensor: a read-only view of its memory where DLPack can give
    one (``Tensor.numpy`` copies), else a copy (strings; a tensor on a GPU)."""
    if tensor.dtype.as_numpy_dtype is not object and tensor.device.endswith("CPU:0"):
        try:
            return np.from_dlpack(tensor)
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass  # a dtype or layout DLPack cannot carry: copy it as before
    return tensor.numpy()
