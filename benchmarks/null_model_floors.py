"""The model-less floors of ``benchmarks.null_model``: the null model's slice done in the Spark
Python worker, with no server, by the same kind of UDF as each udfserve path.

Kept out of modules that import pandas: Spark pickles these functions by reference, so a worker
imports this module, pyarrow and numpy, as the Arrow paths' workers do. The slice itself is one
numpy view and one copy of the kept values, the least any UDF returning them can do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def first_values(rows: pa.Array, kept: int) -> pa.ListArray:
    """The first ``kept`` values of each row of a list column of equal-length rows."""
    count = len(rows)
    flat = rows.flatten().to_numpy(zero_copy_only=False).reshape(count, -1)
    values = pa.array(np.ascontiguousarray(flat[:, :kept]).ravel())
    offsets = pa.array(np.arange(0, (count + 1) * kept, kept, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, values)


def sliced_arrays(kept: int) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
    """An iterator ``arrow_udf`` function: each batch's first ``kept`` values of its rows (the floor
    of ``remote_predict(udf_type='arrow')``, an ``arrow_udf`` of the same form)."""

    # Spark infers the iterator form from these hints
    def slice_arrays(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
        for rows in arrays:
            yield first_values(rows, kept)

    return slice_arrays


def sliced_batches(
    column: str, kept: int, output: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: each batch with ``output`` appended, ``column``'s first ``kept``
    values (the floor of ``predict_arrow``)."""

    def slice_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield batch.append_column(output, first_values(batch.column(column), kept))

    return slice_batches


def sliced_files(
    column: str, kept: int, output: str, batch_rows: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over rows of parquet paths (``path``): each file read with pyarrow
    in ``batch_rows``-row batches, returned as ``id`` and ``output`` (the floor of
    ``predict_files``, which reads its files the same way and returns the same columns)."""

    def slice_files(paths: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in paths:
            for path in batch.column("path").to_pylist():
                reader = pq.ParquetFile(path)
                for read in reader.iter_batches(batch_size=batch_rows, columns=["id", column]):
                    yield pa.RecordBatch.from_arrays(
                        [read.column("id"), first_values(read.column(column), kept)], ["id", output]
                    )

    return slice_files
