"""Spark's pandas data to request batches, and answers back to pandas, for ``remote_predict``.

No numeric value is touched row by row in Python: array columns, which pandas holds as a Series
of numpy arrays, are joined with one ``np.concatenate`` per nesting level and wrapped in Arrow
list arrays around the flat values (several times faster than ``pa.array`` on the Series:
docs/benchmarks.md, section 2, "Reading the numbers"); answers become pandas through Arrow's own
conversion.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa

from udfserve.spark_client.common.model_spec import ModelSpec, Tensor
from udfserve.spark_client.executor.convert import match_inputs
from udfserve.spark_client.executor.rechunk import Pieces

PandasInput: TypeAlias = pd.Series | pd.DataFrame


def pandas_to_request(columns: PandasInput | tuple[PandasInput, ...], spec: ModelSpec) -> pa.RecordBatch:
    """One request batch from what a pandas UDF receives.

    A Series feeds a single-input model; a DataFrame (a struct column) feeds the inputs by field
    name, else by position; a tuple of Series feeds the inputs by position.
    """
    if isinstance(columns, pd.DataFrame):
        names = [str(c) for c in columns.columns]
        order = match_inputs(names, spec, "struct fields")
        arrays = [series_to_arrow(columns.iloc[:, i]) for i in order]
    else:
        given = columns if isinstance(columns, tuple) else (columns,)
        order = match_inputs([f"column {i}" for i in range(len(given))], spec, "columns")
        arrays = []
        for i in order:
            column = given[i]
            if isinstance(column, pd.DataFrame):
                raise ValueError(
                    f"model {spec.name!r}: input {spec.input_names[len(arrays)]!r} received a struct column "
                    f"with fields {list(column.columns)}; expected a numeric or array column"
                )
            arrays.append(series_to_arrow(column))
    for array, tensor in zip(arrays, spec.inputs, strict=True):
        _refuse_nan_for_integers(array, tensor, spec.name)
    return pa.RecordBatch.from_arrays(arrays, names=list(spec.input_names))


def _refuse_nan_for_integers(array: pa.Array, tensor: Tensor, model: str) -> None:
    """Spark hands a pandas UDF an integer column holding nulls as floats with NaN in their
    place; the server would only see floats where it expects integers, and say that."""
    if tensor.dtype == "string" or not np.issubdtype(np.dtype(tensor.dtype), np.integer):
        return
    values = array
    while isinstance(values, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        values = values.flatten()
    if not pa.types.is_floating(values.type):
        return
    nan = np.flatnonzero(np.isnan(values.to_numpy(zero_copy_only=False)))
    if len(nan):
        where = f"row {int(nan[0])} of the request" if values is array else "a row of the request"
        raise ValueError(
            f"model {model!r}: input {tensor.name!r} takes {tensor.dtype} values and its column holds a null "
            f"({where}): Spark hands a pandas UDF an integer column with nulls as floats with NaN in "
            "their place; expected no nulls (fill or filter them, or use udf_type='arrow', which refuses "
            "them by row too)"
        )


def pandas_pieces(item: PandasInput | tuple[PandasInput, ...], spec: ModelSpec, rows: int) -> Pieces:
    """A Spark batch for the rechunker, converted ``rows`` rows at a time as the requests need them.

    Converted rows then live only while their request is in flight, instead of a converted copy
    of the whole batch (Spark hands over up to ``maxRecordsPerBatch`` rows at once) living until
    its last request is answered.
    """
    given = item if isinstance(item, tuple) else (item,)
    total = len(given[0])

    def converted() -> Iterator[pa.RecordBatch]:
        for start in range(0, total, rows):
            sliced = tuple(column.iloc[start : start + rows] for column in given)
            yield pandas_to_request(sliced if isinstance(item, tuple) else sliced[0], spec)

    return Pieces(total, converted())


def series_to_arrow(series: pd.Series) -> pa.Array:
    """A numeric Series as a primitive array; a Series of (nested) arrays as (nested) list arrays."""
    values = series.to_numpy()
    if values.dtype != object:
        return pa.array(values)
    if len(values) and isinstance(values[0], (str, bytes)):
        return pa.array(series)  # a string column; Arrow refuses a row of another type by itself
    try:
        return _objects_to_lists(values)
    except (TypeError, ValueError):
        # Nulls or ragged nesting: let Arrow build it row by row; the server names the bad row.
        return pa.array(series)


def _objects_to_lists(values: np.ndarray) -> pa.Array:
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(values) if len(values) else np.zeros(0, dtype=np.float32)
    child = _objects_to_lists(flat) if flat.dtype == object else pa.array(flat)
    if offsets[-1] < np.iinfo(np.int32).max:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), child)
    return pa.LargeListArray.from_arrays(pa.array(offsets), child)


def answer_to_pandas(answer: pa.RecordBatch, as_struct: bool) -> PandasInput:
    """The UDF's result: a Series for one output, a DataFrame (a struct) for several."""
    if as_struct:
        return pd.DataFrame(
            {
                name: _to_pandas(column)
                for name, column in zip(answer.schema.names, answer.columns, strict=True)
            }
        )
    return _to_pandas(answer.column(0))


def _to_pandas(column: pa.Array) -> pd.Series:
    return column.to_pandas()
