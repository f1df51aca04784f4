"""What ``remote_predict`` runs in the executors: a pandas UDF over the node's model server.

Kept apart from ``udf`` so that only pandas UDF workers import pandas; ``predict_arrow``'s
workers (``mapInArrow``) never do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Tuple, Union  # noqa: UP035 (pyspark reads these hints)

import pandas as pd

from udfserve.spark_client.executor.pandas_convert import answer_to_pandas, pandas_pieces
from udfserve.spark_client.executor.partition import PredictJob
from udfserve.spark_client.executor.task import answer_partition


def pandas_function(job: PredictJob, as_struct: bool, fields: Sequence[str] | None = None) -> Any:
    """The function to wrap in ``pandas_udf``: batches of the input columns in, predictions out.

    ``fields``: the struct return type's field names, in its order, when they are known in the
    driver (Spark takes a struct's columns by position, then checks their names); None: every
    output, in the model's order.
    """

    # Spark infers the iterator form from these hints; it passes a tuple for several columns
    # and the bare Series (or DataFrame, for a struct) for one.
    def predict(batches: Iterator[PandasArgs]) -> Iterator[pd.Series]:
        yield from predict_pandas(job, batches, as_struct)

    def predict_struct(batches: Iterator[PandasArgs]) -> Iterator[pd.DataFrame]:
        for frame in predict_pandas(job, batches, as_struct):
            yield frame[list(fields)] if fields is not None else frame

    return predict_struct if as_struct else predict


PandasArgs = Tuple[Union[pd.Series, pd.DataFrame], ...]  # noqa: UP006, UP007


def predict_pandas(job: PredictJob, batches: Iterator[Any], as_struct: bool) -> Iterator[Any]:
    """One partition's predictions, a Series (or a DataFrame for a struct) per Spark batch."""
    requests = ((None, pandas_pieces(item, job.spec, job.config.rows_per_request)) for item in batches)
    for _, answer in answer_partition(job, requests):
        yield answer_to_pandas(answer, as_struct)
