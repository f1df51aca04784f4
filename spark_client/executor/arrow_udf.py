"""What ``remote_predict(..., udf_type="arrow")`` runs in the executors: an Arrow UDF over the
node's model server.

PySpark's Arrow UDFs (``pyspark.sql.functions.arrow_udf``, PySpark 4.1 and later) hand the UDF
the column as Spark's own Arrow arrays, so the rows reach the request without pandas: no
conversion of array columns to a Series of numpy arrays and back, and no pandas in the worker
(about 45 MiB of resident memory per Python worker, and most of the CPU a pandas UDF spends
outside the model). The column API is the pandas UDF's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from udfserve.spark_client.executor.convert import answer_to_array, array_to_request
from udfserve.spark_client.executor.partition import PredictJob
from udfserve.spark_client.executor.task import answer_partition


def arrow_function(
    job: PredictJob, as_struct: bool, fields: Sequence[str] | None = None
) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
    """The function to wrap in ``arrow_udf``: batches of the input column in, predictions out.

    ``fields``: the struct return type's field names in its order, when known in the driver;
    None: every output in the model's order, then ``model_version`` when the job answers it.
    """

    # Spark infers the iterator form from these hints; several inputs travel as one struct column.
    def predict(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        yield from predict_arrays(job, batches, as_struct, fields)

    return predict


def predict_arrays(
    job: PredictJob, batches: Iterator[pa.Array], as_struct: bool, fields: Sequence[str] | None = None
) -> Iterator[pa.Array]:
    """One partition's predictions, an array (a struct array for several outputs) per Spark batch."""
    requests = ((None, array_to_request(column, job.spec)) for column in batches)
    for _, answer in answer_partition(job, requests):
        yield answer_to_array(answer, job.spec, as_struct, fields)
