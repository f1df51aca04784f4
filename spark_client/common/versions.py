"""The model version that computed each row: the column a job asks for, and its rules.

Every answer says which version of the model computed it (``PredictResponse.model_version``,
``ModelInferResponse.model_version``, the CPU fallback's loaded version). The rows of one request
come from one version; the rows of a partition may come from several, when a server switches to a
new version while the partition streams. A UDF asked for the version (``with_version=True``, or a
struct return type with a ``model_version`` field) answers it per row, as a ``bigint`` next to the
model's outputs, so a job can tell which rows came from which version.

Pandas-free, like ``convert``: the Arrow workers import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from udfserve.spark_client.common.model_spec import ModelSpec

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

VERSION_FIELD = "model_version"
"""The name of the version's column (a struct field for a UDF, a column for ``predict_arrow``)."""

VERSION_TYPE = pa.int64()

UNKNOWN_VERSION = 0
"""The version of an answer whose server did not name one (a KServe server may leave it empty)."""


def with_version_column(answer: pa.RecordBatch, version: int) -> pa.RecordBatch:
    """``answer`` with the version that computed it appended as a ``model_version`` column."""
    # From a numpy buffer: ``pa.scalar`` and ``pa.array`` import pandas, which Arrow workers never need.
    values = np.full(answer.num_rows, version, dtype=np.int64)
    column = pa.Array.from_buffers(VERSION_TYPE, answer.num_rows, [None, pa.py_buffer(values)])
    return pa.RecordBatch.from_arrays([*answer.columns, column], names=[*answer.schema.names, VERSION_FIELD])


def empty_versioned(empty: pa.RecordBatch) -> pa.RecordBatch:
    """Zero rows of the outputs and of the version column, for an empty Spark batch."""
    return with_version_column(empty, UNKNOWN_VERSION)


def kserve_version(text: str) -> int:
    """A KServe answer's ``model_version`` (a string) as a number; ``UNKNOWN_VERSION`` when the
    server left it empty or named something that is not a version number."""
    return int(text) if text.isdigit() else UNKNOWN_VERSION


def wants_version(spec: ModelSpec, return_type: DataType | str | None, with_version: bool) -> bool:
    """Whether the UDF answers the version of each row: asked for, or a field of the return type.

    A struct return type with a ``model_version`` field asks for it, unless the model has an output
    of that name (then the field is that output, as before). ``with_version=True`` on a model with
    such an output is refused: the two would share one name.
    """
    has_output = VERSION_FIELD in spec.output_names
    if with_version and has_output:
        raise ValueError(
            f"model {spec.name!r} has an output named {VERSION_FIELD!r}, the name of the version field "
            "with_version=True adds; expected with_version=False for this model (its answers carry the "
            "version in the job's counters, udf.stats().rows_by_version)"
        )
    return with_version or (not has_output and VERSION_FIELD in _struct_fields(return_type))


def check_version_field(spec: ModelSpec, return_type: DataType | str) -> None:
    """Refuse a return type that cannot hold the version of each row: it must be a struct with a
    ``model_version bigint`` field next to the outputs. An unparsed DDL string is left to Spark."""
    from pyspark.sql.types import LongType, StructType

    if isinstance(return_type, str):
        if not return_type.strip().lower().startswith("struct"):
            raise ValueError(_needs_struct(spec, return_type))
        return
    if not isinstance(return_type, StructType):
        raise ValueError(_needs_struct(spec, return_type.simpleString()))
    field = next((f for f in return_type.fields if f.name == VERSION_FIELD), None)
    if field is None:
        raise ValueError(_needs_struct(spec, return_type.simpleString()))
    if not isinstance(field.dataType, LongType):
        raise ValueError(
            f"model {spec.name!r}: the return type's field {VERSION_FIELD!r} is "
            f"{field.dataType.simpleString()}; expected bigint, which holds the version that computed "
            "each row"
        )


def _needs_struct(spec: ModelSpec, received: str) -> str:
    fields = ", ".join(f"{name}: ..." for name in spec.output_names)
    return (
        f"model {spec.name!r}: the version of each row is answered as a struct field {VERSION_FIELD!r}; "
        f"expected a struct return type with a '{VERSION_FIELD}: bigint' field next to the outputs "
        f"(struct<{fields}, {VERSION_FIELD}: bigint>), or no return type, received {received}"
    )


def _struct_fields(return_type: DataType | str | None) -> list[str]:
    if return_type is None or isinstance(return_type, str):
        return []  # an unparsed DDL string is read by Spark: ask with with_version=True
    from pyspark.sql.types import StructType

    return [f.name for f in return_type.fields] if isinstance(return_type, StructType) else []
