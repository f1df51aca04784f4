"""Inputs that Spark and numpy compute identically, and the model's own outputs for them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS = 100_000
"""Rows of the main equality tests."""


def feature_values(ids: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic float32 inputs from row ids: integer arithmetic, one division, one rounding."""
    positions = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    mixed = (ids.reshape((-1,) + (1,) * len(shape)) * 7919 + positions * 104729) % 1000
    return (mixed / 1000.0 - 0.5).astype(np.float32)


def feature_column(shape: tuple[int, ...]) -> object:
    """The same values as ``feature_values``, as a Spark column of (nested) float arrays of the row's id."""
    from pyspark.sql import functions as F

    def level(offset: object, dims: tuple[int, ...]) -> object:
        if not dims:
            value = ((F.col("id") * 7919 + offset * 104729) % 1000) / F.lit(1000.0) - F.lit(0.5)  # type: ignore[operator]
            return value.cast("float")
        stride = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        return F.transform(
            F.sequence(F.lit(0), F.lit(dims[0] - 1)), lambda i: level(offset + i * stride, dims[1:])
        )  # type: ignore[operator]

    return level(F.lit(0), shape)


def reference_outputs(
    repository: Path, model: str, inputs: dict[str, np.ndarray], version: int = 1
) -> dict[str, np.ndarray]:
    """The model's own output in this process: Keras loads the file the server loads and calls it."""
    import keras

    loaded = keras.saving.load_model(repository / model / str(version) / "model.keras")
    rows = len(next(iter(inputs.values())))
    pieces: list[dict[str, np.ndarray]] = []
    for start in range(0, rows, 10_000):
        arguments = {t.name: inputs[t.name][start : start + 10_000] for t in loaded.inputs}
        result = loaded(arguments if len(arguments) > 1 else next(iter(arguments.values())), training=False)
        if not isinstance(result, dict):
            result = dict(
                zip(loaded.output_names, result if isinstance(result, list) else [result], strict=True)
            )
        pieces.append({name: np.asarray(value) for name, value in result.items()})
    return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}


def stacked(values: object) -> np.ndarray:
    """A pandas column of (nested) arrays as one float array."""
    return np.array([np.stack(v) if v.dtype == object else v for v in values])  # type: ignore[attr-defined]
