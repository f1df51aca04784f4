"""A ``mapInArrow`` function without a model: the ceiling of any Arrow UDF over this data.

Kept out of ``benchmarks.inworker``, which imports pandas: Spark pickles this function by
reference, so its worker imports this module and nothing more than pyarrow and numpy, as the
Arrow contenders' workers do. Its resident memory is then the floor of any ``mapInArrow`` worker
here, the one the Arrow contenders of udfserve are measured against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa


def first_values_batches(
    column: str, output_width: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Each batch with a ``prediction`` column: the first ``output_width`` values of ``column``."""

    def first_values(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = batch.column(column)
            flat = rows.flatten().to_numpy(zero_copy_only=False).reshape(len(batch), -1)
            kept = pa.array(flat[:, :output_width].ravel())
            offsets = pa.array([i * output_width for i in range(len(batch) + 1)], type=pa.int32())
            yield batch.append_column("prediction", pa.ListArray.from_arrays(offsets, kept))

    return first_values
