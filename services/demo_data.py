"""The demo's generated rows, made to fit whichever model it scores, and its answers as text.

The demo reads the model's inputs from its metadata (what ``remote_predict`` learnt from the
server) and generates one Spark column per input, named after it: random floats for a float
tensor (a flat array of the shape's size, which the server reshapes), small integers for an
integer tensor (the example models use them as category ids: ``multi_io`` embeds 16), random
booleans, and a short review-like sentence per row for a string tensor (words drawn from the
row's id: the example text classifier sees words its tokenizer knows, and rows differ). A free
dimension (-1) gets ``FREE_DIMENSION`` values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column

    from udfserve.spark_client.common.model_spec import Tensor

INTEGER_VALUES = 16
"""Integers are drawn from 0..15: valid ids for every embedding of the example models."""

FREE_DIMENSION = 8
"""Values generated along a dimension the model leaves free (-1)."""

SAMPLE_VALUES = 8
"""Values of an array shown per sample prediction; longer arrays end in an ellipsis."""

TEXT_WORDS = (
    ("the movie", "this film", "the plot", "the acting", "the ending"),
    ("was", "is", "felt", "seemed"),
    ("very", "not", "quite", "really", "barely"),
    ("good", "great", "boring", "awful", "fine", "surprising", "délicieux"),
)
"""The words of a generated text, one from each group, chosen by the row's id."""


def values_per_row(tensor: Tensor) -> int:
    """Values one row of ``tensor`` holds (1 for a scalar)."""
    return math.prod(FREE_DIMENSION if dim < 0 else dim for dim in tensor.shape)


def input_column(tensor: Tensor, seed: int) -> Column:
    """A generated Spark column that the model's input ``tensor`` accepts, named after it."""
    from pyspark.sql import functions as F

    def value(index: int) -> Column:
        draw = F.rand(seed=seed * 1_000_003 + index)
        if tensor.dtype.startswith("float"):
            return draw.cast("float")
        if tensor.dtype.startswith(("int", "uint")):
            return (draw * INTEGER_VALUES).cast("int")
        if tensor.dtype == "bool":
            return draw < F.lit(0.5)
        if tensor.dtype == "string":
            return generated_text(seed * 1_000_003 + index)
        raise ValueError(
            f"input {tensor.name!r} has dtype {tensor.dtype!r}; the demo generates float, integer, bool "
            "and string inputs"
        )

    if not tensor.shape:
        return value(0).alias(tensor.name)
    return F.array(*[value(i) for i in range(values_per_row(tensor))]).alias(tensor.name)


def generated_text(seed: int) -> Column:
    """A sentence per row: one word of each group of ``TEXT_WORDS``, picked by a hash of the row's id."""
    from pyspark.sql import functions as F

    words = []
    for group, choices in enumerate(TEXT_WORDS):
        pick = F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(group)), F.lit(len(choices))) + 1
        words.append(F.element_at(F.array(*[F.lit(word) for word in choices]), pick.cast("int")))
    return F.concat_ws(" ", *words)


def input_columns(inputs: Sequence[Tensor]) -> list[Column]:
    """One generated column per input of the model, in the model's order."""
    return [input_column(tensor, seed) for seed, tensor in enumerate(inputs)]


def describe_inputs(inputs: Sequence[Tensor]) -> str:
    """The generated columns in a few words, for the log: ``features: 64 float32``."""
    return ", ".join(
        f"{tensor.name}: {values_per_row(tensor)} {tensor.dtype}"
        if tensor.shape
        else f"{tensor.name}: {tensor.dtype}"
        for tensor in inputs
    )


def format_value(value: Any) -> str:
    """One answer as text: numbers to three places, arrays (the first ``SAMPLE_VALUES`` values)
    in brackets, a struct (several outputs) as ``name=value`` pairs."""
    if hasattr(value, "asDict"):  # a pyspark Row: a struct of outputs
        return ", ".join(f"{name}={format_value(item)}" for name, item in value.asDict().items())
    if isinstance(value, (list, tuple)):
        shown = " ".join(format_value(item) for item in value[:SAMPLE_VALUES])
        return f"[{shown}{' ...' if len(value) > SAMPLE_VALUES else ''}]"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value))
    return str(value)
