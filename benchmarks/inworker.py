"""The in-process contenders of the Spark comparisons: the model inside the Spark Python worker.

These are the recipes data teams use today, given the fast call path (a ``tf.function`` with a
fixed input signature, not ``model.predict``) so that the comparison is with their best form:

- ``make_batch_udf_predict_fn``: what ``pyspark.ml.functions.predict_batch_udf`` calls once per
  worker to get its predict function;
- ``cached_pandas_udf``: an iterator pandas UDF with the model cached once per worker process in
  this module (a module-level cache in an importable module: one in ``__main__`` would reload per
  task);
- ``load_per_batch_pandas_udf``: the anti-pattern, loading the model for every batch;
- ``passthrough_pandas_udf``: no model at all, the ceiling of a pandas UDF over this data.

Every load leaves a file in ``marker_dir`` so the benchmark can count loads. TensorFlow is
imported only inside the loaders, in the worker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

PredictFn = Callable[[np.ndarray], np.ndarray]

_CACHE: dict[str, PredictFn] = {}


def load_predict_fn(model_file: str, marker_dir: str) -> PredictFn:
    """Import TensorFlow, load the Keras model, wrap it in a ``tf.function``; record the load."""
    import keras
    import tensorflow as tf

    model = keras.saving.load_model(model_file, compile=False)
    row_shape = [int(d) for d in model.inputs[0].shape[1:]]
    call = tf.function(
        lambda x: model(x, training=False), input_signature=[tf.TensorSpec([None, *row_shape], tf.float32)]
    )
    Path(marker_dir).mkdir(parents=True, exist_ok=True)
    (Path(marker_dir) / f"{os.getpid()}-{uuid.uuid4().hex}").touch()

    def predict(inputs: np.ndarray) -> np.ndarray:
        return call(inputs.reshape(-1, *row_shape)).numpy()

    return predict


def cached_predict_fn(model_file: str, marker_dir: str) -> PredictFn:
    """The model of ``model_file``, loaded once per Python worker process."""
    if model_file not in _CACHE:
        _CACHE[model_file] = load_predict_fn(model_file, marker_dir)
    return _CACHE[model_file]


def make_batch_udf_predict_fn(model_file: str, marker_dir: str) -> PredictFn:
    """``make_predict_fn`` of ``predict_batch_udf`` (Spark caches its result per worker)."""
    return load_predict_fn(model_file, marker_dir)


def _series_to_array(series: pd.Series) -> np.ndarray:
    """The usual conversion of an ``array<float>`` column: a Series of arrays stacked."""
    return np.stack(series.to_numpy()).astype(np.float32, copy=False)


def _array_to_series(values: np.ndarray) -> pd.Series:
    return pd.Series(list(values))


def cached_pandas_udf(
    model_file: str, marker_dir: str
) -> Callable[[Iterator[pd.Series]], Iterator[pd.Series]]:
    """An iterator pandas UDF function with the model cached once per worker."""

    def predict_batches(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        predict = cached_predict_fn(model_file, marker_dir)
        for series in batches:
            yield _array_to_series(predict(_series_to_array(series)))

    return predict_batches


def load_per_batch_pandas_udf(model_file: str, marker_dir: str) -> Callable[[pd.Series], pd.Series]:
    """A scalar pandas UDF function that loads the model for every batch."""

    def predict_batch(series: pd.Series) -> pd.Series:
        predict = load_predict_fn(model_file, marker_dir)
        return _array_to_series(predict(_series_to_array(series)))

    return predict_batch


def passthrough_pandas_udf(output_width: int) -> Callable[[pd.Series], pd.Series]:
    """No model: the first ``output_width`` values of each row, through the same conversions as
    the cached-model UDF. The ceiling of any pandas UDF over this data."""

    def first_values(series: pd.Series) -> pd.Series:
        return _array_to_series(_series_to_array(series)[:, :output_width])

    return first_values
