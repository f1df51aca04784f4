"""The ranges a Keras model implies for its integer inputs: an input that feeds an ``Embedding``
directly takes ids ``0`` to ``input_dim - 1``, and nothing else runs (``value_ranges``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from udfserve.runtime.tensor_spec import TensorSpec


def embedding_ranges(model: Any) -> dict[str, tuple[int, int]]:
    """``{input name: (0, rows - 1)}`` for every model input that an ``Embedding`` layer reads
    directly; the smallest table wins when an input feeds several."""
    by_id = {id(tensor): tensor.name for tensor in getattr(model, "inputs", None) or ()}
    ranges: dict[str, tuple[int, int]] = {}
    for layer in getattr(model, "layers", ()):
        if not isinstance(layer, keras.layers.Embedding):
            continue
        for node in getattr(layer, "_inbound_nodes", ()):
            for tensor in getattr(node, "input_tensors", ()):
                name = by_id.get(id(tensor))
                if name is None:
                    continue
                high = int(layer.input_dim) - 1
                ranges[name] = (0, min(high, ranges.get(name, (0, high))[1]))
    return ranges


def with_ranges(
    specs: tuple[TensorSpec, ...], ranges: Mapping[str, tuple[int, int]]
) -> tuple[TensorSpec, ...]:
    """``specs`` with the implied range of each integer input that declares none (a declared
    range wins), cut to what the input's dtype holds."""
    result = []
    for spec in specs:
        implied = ranges.get(spec.name)
        if implied is not None and spec.range is None and spec.dtype.startswith(("int", "uint")):
            info = np.iinfo(spec.dtype)
            low, high = max(implied[0], int(info.min)), min(implied[1], int(info.max))
            if low <= high:
                spec = spec.model_copy(update={"range": (low, high)})
        result.append(spec)
    return tuple(result)
