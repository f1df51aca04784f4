"""Checking a request's Arrow columns against a model's inputs, and turning outputs back into Arrow.

These are the product's documented input rules. A request is one record batch whose columns are
named after the model's inputs; each column becomes one numpy array of shape ``(rows, *shape)``
and exactly the declared dtype.

Columns
    A request carries exactly the model's inputs: a missing column, an extra column or a column
    name given twice is refused, naming the expected and the received columns.

Types (the values at the innermost level)
    - float16/32/64 inputs accept any integer or floating-point values. Narrowing float64 to
      float32 is accepted on purpose: Spark's ``double`` columns commonly feed float32 models;
      a value beyond the range of the narrower type becomes an infinity, as in numpy.
    - integer inputs accept integer values when every value fits the declared type (the error
      names the column, the allowed range and the received range); floating-point values are
      refused rather than silently truncated.
    - bool inputs accept bool values only.
    - string inputs (TensorFlow's ``tf.string``) accept ``string``, ``large_string``, ``binary``,
      ``large_binary`` and ``fixed_size_binary`` values, and give an object array of ``bytes``
      (text as its UTF-8 bytes); numbers are refused rather than formatted.
    - strings and binary for a numeric input, decimals, dates and timestamps, structs, maps,
      dictionaries: refused.

Shapes
    - A scalar input (shape ``()``) is a primitive column.
    - An input of per-row shape ``(d1, ..., dk)`` is either k nested levels of ``list``,
      ``large_list`` or ``fixed_size_list`` with exactly those lengths, or one level of list whose
      length is ``d1 * ... * dk`` (a flat row, reshaped by the server; Spark's ``array<float>``).
    - A free dimension (-1) takes its length from the data and must be the same for every row of
      the batch; one free dimension can also be inferred from the flat form.
    - A wrong or ragged length is refused, naming the expected length, the received length and
      the first offending row.

Values
    - A null anywhere (a null row, a null list, a null element) is refused, naming the first row
      holding one. NaN and infinities pass through untouched.
    - A batch of zero rows is valid and gives arrays of shape ``(0, *dims)``, free dims being 0.

No value is converted row by row in Python: lists are checked through their offsets and the
innermost values are reshaped in one piece. Where the received type is already the declared one
the arrays are zero-copy, read-only views of the request's buffers (string values are the one
exception: numpy holds them as one ``bytes`` object each, which is what ``tf.string`` takes).

Requests of one model mostly share one Arrow schema, so what can be decided from the schema
alone (the column names, each column's nesting and value type, and whether it is the common
case) is decided once and cached per (model, inputs, schema). For the common case, a column of
the declared value type whose every list level has a declared fixed length, a request then
costs a null count and one offsets comparison per level and one reshape; anything else, or any
doubt, goes through the full check, which also writes every error message
(``column_conversion``).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from udfserve.runtime.column_conversion import ColumnConverter, ColumnPlan
from udfserve.runtime.errors import BackendFault, InvalidInput
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec, numpy_dtype, shape_text

SCHEMAS_PER_MODEL = 8
MODELS_PLANNED = 256
"""Conversion plans kept: the last few schemas of each (model, inputs), for the most recently
planned models. Far more than a server meets, yet bounded against clients that send a new schema
with every request. Schemas are compared with ``equals`` (a C++ comparison), not hashed: hashing
a ``pa.Schema`` walks its fields in Python and costs more than a whole conversion."""

_Plan = tuple[tuple[str, int, ColumnPlan], ...]
"""Per input: its name, the index of its column, and how to convert that column."""

_plans: dict[tuple[str, tuple[TensorSpec, ...]], tuple[tuple[pa.Schema, _Plan], ...]] = {}
_plans_lock = threading.Lock()


def batch_to_inputs(
    batch: pa.RecordBatch, model_name: str, inputs: Sequence[TensorSpec]
) -> dict[str, np.ndarray]:
    """Check ``batch`` against the model's inputs and return one array per input, by name."""
    plan = _plan(model_name, tuple(inputs), batch.schema)
    return {name: column.convert(batch.column(index)) for name, index, column in plan}


def _plan(model_name: str, inputs: tuple[TensorSpec, ...], schema: pa.Schema) -> _Plan:
    """The cached plan of this schema, or a new one (readers take no lock: entries are replaced
    whole, never changed in place)."""
    key = (model_name, inputs)
    known = _plans.get(key, ())
    for planned_schema, plan in known:
        if planned_schema.equals(schema):
            return plan
    plan = _new_plan(model_name, inputs, schema)
    with _plans_lock:
        previous = _plans.pop(key, ())  # re-inserted last: the most recently planned model
        _plans[key] = ((schema, plan), *previous[: SCHEMAS_PER_MODEL - 1])
        while len(_plans) > MODELS_PLANNED:
            del _plans[next(iter(_plans))]
    return plan


def _new_plan(model_name: str, inputs: tuple[TensorSpec, ...], schema: pa.Schema) -> _Plan:
    """What the schema alone decides; a schema that is refused raises, and is not cached."""
    prefix = f"model '{model_name}': "
    _check_column_names(schema.names, [spec.name for spec in inputs], prefix)
    plan = []
    for spec in inputs:
        index = schema.get_field_index(spec.name)
        plan.append((spec.name, index, ColumnPlan(ColumnConverter(prefix, spec), schema.field(index).type)))
    return tuple(plan)


def answer_bytes_at_least(specs: Sequence[TensorSpec], rows: int) -> int:
    """The fewest bytes the values of ``rows`` rows of ``specs`` take, known before the model
    runs: fixed-size outputs count fully, strings and free dimensions as nothing. An answer this
    big cannot fit a message whatever the model computes, so a request can be refused before it
    takes a backend call."""
    return rows * sum(_fixed_row_bytes(spec) for spec in specs)


@functools.lru_cache(maxsize=1024)
def _fixed_row_bytes(spec: TensorSpec) -> int:
    """Bytes of one row of ``spec``, 0 for strings and free dimensions (asked per request: cached,
    since ``np.prod`` and ``np.dtype`` cost more than the rest of a small request's checks)."""
    if spec.dtype == STRING_DTYPE or FREE_DIM in spec.shape:
        return 0
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def check_answer_size(
    model_name: str, rows: int, size_bytes: int, limit_bytes: int, *, before_running: bool = False
) -> None:
    """Refuse an answer over the message limit, naming both sizes (INVALID_ARGUMENT: the request
    asks for too many rows). ``before_running``: ``size_bytes`` is the least the answer will take
    (``answer_bytes_at_least``), checked before the model runs."""
    if size_bytes <= limit_bytes:
        return
    size = f"would be at least {size_bytes}" if before_running else f"is {size_bytes}"
    raise InvalidInput(
        f"model {model_name!r}: the answer to {rows} rows {size} bytes, over the {limit_bytes} byte "
        "message limit; send fewer rows per request"
    )


def outputs_to_batch(outputs: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> pa.RecordBatch:
    """One record batch of the outputs in ``specs`` order: a scalar output becomes a primitive
    column, a vector a ``fixed_size_list``, a higher-rank tensor nested ``fixed_size_list``s."""
    columns: list[pa.Array] = []
    rows: int | None = None
    first_name = ""
    for spec in specs:
        if spec.name not in outputs:
            raise BackendFault(
                f"backend returned no output '{spec.name}'; expected outputs "
                f"{[s.name for s in specs]}, received {sorted(outputs)}"
            )
        array = np.asarray(outputs[spec.name])
        _check_output_shape(array, spec)
        if rows is None:
            rows, first_name = int(array.shape[0]), spec.name
        elif array.shape[0] != rows:
            raise BackendFault(
                f"backend output '{spec.name}' has {array.shape[0]} rows but output '{first_name}' "
                f"has {rows}; every output must have one row per input row"
            )
        columns.append(_tensor_to_arrow(array.astype(numpy_dtype(spec.dtype), copy=False), spec.dtype))
    return pa.RecordBatch.from_arrays(columns, names=[spec.name for spec in specs])


def _check_column_names(received: list[str], expected: list[str], prefix: str) -> None:
    duplicates = sorted(name for name, count in Counter(received).items() if count > 1)
    if duplicates:
        raise InvalidInput(
            f"{prefix}column(s) {duplicates} appear more than once; expected each of the inputs "
            f"{expected} exactly once, received columns {received}"
        )
    missing = [name for name in expected if name not in received]
    if missing:
        raise InvalidInput(
            f"{prefix}missing input column(s) {missing}; expected columns {expected}, received {received}"
        )
    extra = [name for name in received if name not in expected]
    if extra:
        raise InvalidInput(
            f"{prefix}unexpected column(s) {extra}; a request carries exactly the model's inputs "
            f"{expected}, received {received}"
        )


def _check_output_shape(array: np.ndarray, spec: TensorSpec) -> None:
    shape = spec.shape
    per_row = tuple(array.shape[1:])
    matches = array.ndim == len(shape) + 1 and all(
        wanted in (FREE_DIM, got) for wanted, got in zip(shape, per_row, strict=True)
    )
    if not matches:
        raise BackendFault(
            f"backend output '{spec.name}' has shape {array.shape}; expected (rows, *{shape_text(shape)})"
        )


def _tensor_to_arrow(array: np.ndarray, dtype: str) -> pa.Array:
    """Nest fixed-size lists around the flat values; numeric values are not copied when contiguous,
    string values (``bytes`` objects) become ``binary``."""
    array = np.ascontiguousarray(array)
    value_type = pa.binary() if dtype == STRING_DTYPE else None
    result = pa.array(array.reshape(-1), type=value_type)
    for axis in range(array.ndim - 1, 0, -1):
        dim, length = array.shape[axis], math.prod(array.shape[:axis])
        result = pa.Array.from_buffers(pa.list_(result.type, dim), length, [None], children=[result])
    return result
