"""udfserve through Spark without Spark's parquet reader: each task reads its files with pyarrow in
the Python worker and streams the batches to the server through ``arrow_predictor``.

Spark's own path reads parquet in the JVM, turns the columns into rows and the rows into Arrow
for the Python worker; for a wide ``array<float>`` column that costs more than the model (the
end-to-end comparison's CPU table). Here Spark only schedules one task per file and receives ids
and predictions, as Ray Data's read tasks read the same files. Kept apart from
``benchmarks.inworker`` (which imports pandas): Spark pickles these functions by reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa


def files_frame(spark: Any, data: str) -> Any:
    """One row per parquet file of ``data``, one partition per file."""
    files = sorted(str(path) for path in Path(data).glob("*.parquet"))
    return spark.createDataFrame([(f,) for f in files], "path string").repartition(len(files))


def read_and_predict(
    predictor: Any, column: str, batch_rows: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: each path's rows, read in batches of ``batch_rows``, out as
    ``id`` and the predictor's outputs (the input column is not sent back to the JVM)."""

    def predict(paths: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        for batch in paths:
            for path in batch.column("path").to_pylist():
                source = pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["id", column])
                for answered in predictor(source):
                    yield answered.drop_columns([column])

    return predict
