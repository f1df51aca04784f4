"""The values a model's integer inputs may take, checked per request before it is batched.

An embedding table of N rows takes ids 0 to N-1. TensorFlow refuses any other id only when it
runs the graph, which fails the whole merged call of every client whose requests were batched
with it; the batcher then runs each request again alone to find the bad one, so one client
sending bad ids costs every other client most of its throughput. A ``TensorSpec.range``
(declared in ``config.yaml``, or read from the model: ``backends/tensorflow/keras_ranges``) lets the server
refuse such a request on its own, before it is merged, with INVALID_ARGUMENT naming the input,
the row, the value and the range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.tensor_spec import TensorSpec


def check_ranges(model_name: str, specs: Sequence[TensorSpec], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse ``inputs`` (rows first) holding a value outside the range of its input's spec."""
    for spec in specs:
        if spec.range is None:
            continue
        array = inputs.get(spec.name)
        if array is None or array.size == 0:
            continue
        low, high = spec.range
        if low <= array.min() and array.max() <= high:
            continue
        values = array.reshape(array.shape[0], -1)
        outside = (values < low) | (values > high)
        row = int(np.flatnonzero(outside.any(axis=1))[0])
        value = int(values[row][outside[row]][0])
        raise InvalidInput(
            f"model {model_name!r}: input {spec.name!r} row {row} holds {value}, outside the range "
            f"[{low}, {high}] the model takes; expected values in [{low}, {high}]"
        )
