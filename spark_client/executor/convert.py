"""Spark's Arrow data to request batches, and answers back to what ``mapInArrow`` and Arrow UDFs
accept.

Pandas-free on purpose: the workers of ``predict_arrow`` (``mapInArrow``) and of
``remote_predict(..., udf_type="arrow")`` never import pandas, which is about 45 MiB of resident
memory per Python worker; the pandas UDF's conversions live in ``pandas_convert``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from udfserve.spark_client.common.model_spec import ModelSpec


def match_inputs(names: Sequence[str], spec: ModelSpec, what: str) -> list[int]:
    """For each model input, the index of the column feeding it: by name when every input has a
    column of its name, else by position (in the order the model's metadata lists its inputs)."""
    inputs = list(spec.input_names)
    if all(name in names for name in inputs):
        return [list(names).index(name) for name in inputs]
    if len(names) == len(inputs):
        return list(range(len(inputs)))
    raise ValueError(
        f"model {spec.name!r} has input(s) {inputs}; expected {what} named after them or {len(inputs)} "
        f"of them in that order, received {list(names)}"
    )


def answer_to_spark_columns(answer: pa.RecordBatch, spec: ModelSpec) -> list[pa.Array]:
    """The answer's columns as Spark takes them from ``mapInArrow``: fixed-size lists become lists;
    the ``model_version`` column after the outputs, when the answer has it, as it is (bigint)."""
    outputs = len(spec.outputs)
    converted = [
        column if column.type == tensor.spark_arrow_type() else column.cast(tensor.spark_arrow_type())
        for column, tensor in zip(answer.columns[:outputs], spec.outputs, strict=True)
    ]
    return converted + answer.columns[outputs:]


def answer_to_array(
    answer: pa.RecordBatch, spec: ModelSpec, as_struct: bool, fields: Sequence[str] | None = None
) -> pa.Array:
    """The answer as an Arrow UDF returns it: the output's column, or a struct of the outputs (and
    of ``model_version`` when the answer has it), in the order of ``fields`` when given."""
    columns = answer_to_spark_columns(answer, spec)
    if as_struct:
        names = answer.schema.names
        if fields is not None:
            columns = [columns[names.index(name)] for name in fields]
            names = list(fields)
        return pa.StructArray.from_arrays(columns, names=names)
    return columns[0]


def array_to_request(column: pa.Array | tuple[pa.Array, ...], spec: ModelSpec) -> pa.RecordBatch:
    """The request for what an Arrow UDF receives: a column feeding a single-input model, a
    struct column feeding the inputs by field name, else by position, or the inputs' columns in
    order (the Spark UDF called with several columns)."""
    if isinstance(column, tuple):
        order = match_inputs([f"column {i}" for i in range(len(column))], spec, "columns")
        arrays = [column[i] for i in order]
    elif pa.types.is_struct(column.type):
        names = [column.type.field(i).name for i in range(column.type.num_fields)]
        fields = column.flatten()
        arrays = [fields[i] for i in match_inputs(names, spec, "struct fields")]
    else:
        match_inputs(["column 0"], spec, "columns")
        arrays = [column]
    return pa.RecordBatch.from_arrays(arrays, names=list(spec.input_names))


def arrow_to_request(batch: pa.RecordBatch, columns: Sequence[str], spec: ModelSpec) -> pa.RecordBatch:
    """The request for a ``mapInArrow`` batch: the named columns, or the fields of one struct column."""
    if len(columns) == 1 and len(spec.inputs) > 1:
        struct = batch.column(columns[0])
        if not pa.types.is_struct(struct.type):
            raise ValueError(
                f"model {spec.name!r} has inputs {list(spec.input_names)}; a single input column must be a "
                f"struct with a field per input, received column {columns[0]!r} of type {struct.type}"
            )
        names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
        fields = struct.flatten()
        arrays = [fields[i] for i in match_inputs(names, spec, "struct fields")]
    else:
        arrays = [batch.column(columns[i]) for i in match_inputs(list(columns), spec, "columns")]
    return pa.RecordBatch.from_arrays(arrays, names=list(spec.input_names))
