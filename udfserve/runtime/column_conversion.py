"""How one Arrow column becomes one numpy array of a model input: the common case directly, anything
else through the full check.

``ColumnConverter`` applies every input rule of ``tensor_conversion`` to a column and writes each
refusal's message. ``ColumnPlan`` holds what one column type alone decides, so that a column of
the declared value type whose every list level has a declared fixed length costs a null count,
one offsets comparison per level and one reshape; any doubt hands the column to the converter.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from udfserve.arrow_types import is_list_type, is_string_type
from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec, numpy_dtype, shape_text


class ColumnPlan:
    """One column of one Arrow type: the common case converted directly, anything else (and every
    refusal) through the full ``ColumnConverter``."""

    def __init__(self, converter: ColumnConverter, column_type: pa.DataType) -> None:
        self.converter = converter
        self.rows_shape = converter.spec.shape
        self.levels = self._common_case_levels(converter, column_type)
        self.values_kind = "" if self.levels is None else self._values_kind(converter, column_type)
        self._offsets_bytes: dict[tuple[int, int, int], bytes] = {}

    @staticmethod
    def _common_case_levels(
        converter: ColumnConverter, column_type: pa.DataType
    ) -> tuple[tuple[int, int], ...] | None:
        """Per list level, the length every list must have and the byte width of its offsets (0 for
        a fixed-size list, whose type already guarantees the length); None when the column is not
        the common case."""
        shape = converter.spec.shape
        if FREE_DIM in shape:
            return None
        depth, leaf_type = converter._list_depth(column_type)
        try:
            converter._check_value_type(leaf_type, column_type)
        except InvalidInput:
            return None
        if depth == len(shape):
            wanted: tuple[int, ...] = shape
        elif depth == 1 and len(shape) > 1:
            wanted = (math.prod(shape),)
        else:
            return None
        levels: list[tuple[int, int]] = []
        for length in wanted:
            if pa.types.is_fixed_size_list(column_type):
                if column_type.list_size != length:
                    return None
                levels.append((length, 0))
            else:
                levels.append((length, 8 if pa.types.is_large_list(column_type) else 4))
            column_type = column_type.value_type
        return tuple(levels)

    @staticmethod
    def _values_kind(converter: ColumnConverter, column_type: pa.DataType) -> str:
        """How the innermost values become the declared dtype: ``string``, ``cast`` (no value can be
        out of range), ``narrow_float`` (may overflow to infinity, on purpose) or ``check`` (integers
        that may not fit: narrowed, and compared with what was received)."""
        if converter.spec.dtype == STRING_DTYPE:
            return "string"
        _, leaf_type = converter._list_depth(column_type)
        source, target = np.dtype(leaf_type.to_pandas_dtype()), converter.target
        if np.can_cast(source, target, casting="safe"):
            return "cast"
        return "narrow_float" if target.kind == "f" else "check"

    def convert(self, column: pa.Array) -> np.ndarray:
        levels = self.levels
        if levels is None or column.null_count:
            return self.converter.convert(column)
        rows = count = len(column)
        values = column
        for length, offset_bytes in levels:
            if offset_bytes:
                expected = self._offsets(count, length, offset_bytes)
                if values.offsets.to_numpy().tobytes() != expected:
                    return self.converter.convert(column)  # ragged, sliced or of another length
            count *= length
            if values.offset:
                values = values.flatten()
            else:
                values = values.values
                if len(values) != count:
                    values = values.slice(0, count)
            if values.null_count:
                return self.converter.convert(column)
        kind = self.values_kind
        if kind == "string":
            array = _bytes_objects(values)
        elif kind == "cast":
            array = _numeric_values(values).astype(self.converter.target, copy=False)
        elif kind == "narrow_float":
            with np.errstate(over="ignore"):  # documented: too large for a narrower float becomes +-inf
                array = values.to_numpy(zero_copy_only=False).astype(self.converter.target)
        else:
            received = values.to_numpy(zero_copy_only=False)
            array = received.astype(self.converter.target)
            if not (array == received).all():  # some value did not fit: the converter names it
                return self.converter.convert(column)
        return array.reshape((rows, *self.rows_shape))

    def _offsets(self, count: int, length: int, offset_bytes: int) -> bytes:
        """The offsets of ``count`` lists of ``length`` from 0, as the buffer holds them."""
        key = (count, length, offset_bytes)
        expected = self._offsets_bytes.get(key)
        if expected is None:
            if len(self._offsets_bytes) >= 16:  # batch sizes vary little; keep a handful
                self._offsets_bytes.clear()
            dtype = np.dtype(np.int64 if offset_bytes == 8 else np.int32).newbyteorder("=")
            expected = (np.arange(count + 1, dtype=dtype) * length).tobytes()
            self._offsets_bytes[key] = expected
        return expected


class ColumnConverter:
    """Converts one column; holds what every error message about it has to say."""

    def __init__(self, prefix: str, spec: TensorSpec) -> None:
        self.spec = spec
        self.prefix = f"{prefix}column '{spec.name}': "
        self.target = numpy_dtype(spec.dtype)

    def convert(self, column: pa.Array) -> np.ndarray:
        rows = len(column)
        depth, leaf_type = self._list_depth(column.type)
        self._check_value_type(leaf_type, column.type)
        shape = self.spec.shape
        if depth != len(shape) and not (depth == 1 and len(shape) > 1):
            raise self._error(f"expected {self._describe()}, received type {column.type}")
        self._check_no_nulls(column, per_row=1, top=True)
        if depth == len(shape):
            dims, leaf = self._unnest(column)
        else:
            dims, leaf = self._unflatten(column)
        per_row = math.prod(dims)
        values = self._values_to_numpy(leaf, per_row)
        return values.reshape((rows, *dims))

    def _error(self, detail: str) -> InvalidInput:
        return InvalidInput(self.prefix + detail)

    def _describe(self) -> str:
        shape = self.spec.shape
        if not shape:
            return f"a column of {self.spec.dtype} scalars"
        free = " (* = free, one length for the whole batch)" if FREE_DIM in shape else ""
        text = f"{self.spec.dtype} tensors of per-row shape {shape_text(shape)}{free}: "
        if len(shape) == 1:
            return text + "a list column"
        text += f"{len(shape)} nested levels of lists"
        if shape.count(FREE_DIM) <= 1:
            flat = "n" if FREE_DIM in shape else str(math.prod(shape))
            text += f", or one flat list of {flat} values"
        return text

    @staticmethod
    def _list_depth(arrow_type: pa.DataType) -> tuple[int, pa.DataType]:
        depth = 0
        while is_list_type(arrow_type):
            arrow_type = arrow_type.value_type
            depth += 1
        return depth, arrow_type

    def _check_value_type(self, leaf_type: pa.DataType, column_type: pa.DataType) -> None:
        kind = self.target.kind
        if self.spec.dtype == STRING_DTYPE:
            accepted = is_string_type(leaf_type)
            allowed = "string or binary"
        elif kind == "f":
            accepted = pa.types.is_integer(leaf_type) or pa.types.is_floating(leaf_type)
            allowed = "integer or floating-point"
        elif kind in "iu":
            accepted = pa.types.is_integer(leaf_type)
            allowed = "integer"
        else:
            accepted = pa.types.is_boolean(leaf_type)
            allowed = "boolean"
        if not accepted:
            raise self._error(
                f"expected {self._describe()} holding {allowed} values, received type {column_type} "
                f"(values of type {leaf_type})"
            )

    def _check_no_nulls(self, array: pa.Array, per_row: int, *, top: bool = False) -> None:
        """``per_row`` is how many elements of ``array`` make one row (all levels above are uniform)."""
        if array.null_count == 0:
            return
        index = pc.index(pc.is_null(array), True).as_py()
        where = "row" if top else "value inside row"
        raise self._error(f"expected no nulls, received a null {where} {index // max(per_row, 1)}")

    @staticmethod
    def _lengths_and_values(array: pa.Array) -> tuple[np.ndarray | int, pa.Array]:
        """Lengths of the lists (an int when fixed) and their values, honouring slice offsets."""
        if pa.types.is_fixed_size_list(array.type):
            return array.type.list_size, array.flatten()
        offsets = array.offsets.to_numpy()
        if len(array) == 0:
            return np.zeros(0, dtype=np.int64), array.values.slice(0, 0)
        start, end = int(offsets[0]), int(offsets[-1])
        return np.diff(offsets), array.values.slice(start, end - start)

    def _unnest(self, column: pa.Array) -> tuple[list[int], pa.Array]:
        dims: list[int] = []
        current, per_row = column, 1
        for level, wanted in enumerate(self.spec.shape):
            lengths, values = self._lengths_and_values(current)
            dims.append(self._resolve_dim(wanted, lengths, len(current), per_row, level))
            per_row *= dims[-1]
            current = values
            self._check_no_nulls(current, per_row)
        return dims, current

    def _unflatten(self, column: pa.Array) -> tuple[list[int], pa.Array]:
        shape = self.spec.shape
        if shape.count(FREE_DIM) > 1:
            raise self._error(
                f"expected {self._describe()}, received a flat list of type {column.type}: a flat list "
                "can carry at most one free dimension; send nested lists"
            )
        lengths, values = self._lengths_and_values(column)
        known = math.prod(dim for dim in shape if dim != FREE_DIM)
        if FREE_DIM not in shape:
            flat = self._resolve_dim(known, lengths, len(column), 1, 0)
            dims = list(shape)
        else:
            flat = self._resolve_dim(FREE_DIM, lengths, len(column), 1, 0)
            if (known == 0 and flat != 0) or (known != 0 and flat % known != 0):
                raise self._error(
                    f"expected {self._describe()}, received flat lists of length {flat}, "
                    f"which is not a multiple of {known}"
                )
            free = flat // known if known else 0
            dims = [free if dim == FREE_DIM else dim for dim in shape]
        self._check_no_nulls(values, flat)
        return dims, values

    def _resolve_dim(
        self, wanted: int, lengths: np.ndarray | int, count: int, per_row: int, level: int
    ) -> int:
        """The length of one list level, checked: ``count`` lists, ``per_row`` of them per row."""
        where = f" at nesting level {level + 1}" if len(self.spec.shape) > 1 else ""
        if isinstance(lengths, int):
            if wanted not in (FREE_DIM, lengths):
                raise self._error(
                    f"expected {self._describe()}; received fixed-size lists of length {lengths}{where}, "
                    f"expected length {wanted}"
                )
            return lengths
        if count == 0:
            return 0 if wanted == FREE_DIM else wanted
        if wanted == FREE_DIM:
            first = int(lengths[0])
            bad = np.flatnonzero(lengths != first)
            if bad.size:
                index = int(bad[0])
                raise self._error(
                    f"expected lists of one length for every row of the batch{where} (a free dimension "
                    f"of {shape_text(self.spec.shape)}); row 0 has length {first}, received length "
                    f"{int(lengths[index])} in row {index // per_row}"
                )
            return first
        bad = np.flatnonzero(lengths != wanted)
        if bad.size:
            index = int(bad[0])
            raise self._error(
                f"expected {self._describe()}; expected lists of length {wanted}{where}, received length "
                f"{int(lengths[index])} in row {index // per_row}"
            )
        return wanted

    def _values_to_numpy(self, leaf: pa.Array, per_row: int) -> np.ndarray:
        if self.spec.dtype == STRING_DTYPE:
            return _bytes_objects(leaf)
        values = leaf.to_numpy(zero_copy_only=False)
        narrowing = not np.can_cast(values.dtype, self.target, casting="safe")
        if self.target.kind in "iu" and narrowing and values.size:
            info = np.iinfo(self.target)
            low, high = int(values.min()), int(values.max())
            if low < info.min or high > info.max:
                outside = (values < info.min) | (values > info.max)
                index = int(np.flatnonzero(outside)[0])
                raise self._error(
                    f"expected {self.spec.dtype} values in [{info.min}, {info.max}], received values in "
                    f"[{low}, {high}] (first out of range in row {index // max(per_row, 1)})"
                )
        with np.errstate(over="ignore"):  # documented: too large for a narrower float becomes +-inf
            return values.astype(self.target, copy=False)


def _numeric_values(values: pa.Array) -> np.ndarray:
    """Numeric values without nulls as a numpy view. Writable when the memory under them is (a
    request read in place from shared memory), so the backend can hand it to the framework
    without a copy; pyarrow's own view is always read-only, and so is every slice of a buffer,
    which is what an IPC reader hands out: whether the memory is writable is a property of the
    buffer the slices were cut from."""
    data = values.buffers()[1]
    value_type = values.type
    if data is not None and (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        root = data
        while root.parent is not None:
            root = root.parent
        if root.is_mutable:
            dtype = np.dtype(value_type.to_pandas_dtype())
            start = data.address - root.address + values.offset * dtype.itemsize
            return np.frombuffer(root, dtype=dtype, count=len(values), offset=start)
    return values.to_numpy(zero_copy_only=False)


def _bytes_objects(values: pa.Array) -> np.ndarray:
    """String or binary values as an object array of ``bytes``: text is cast to binary first (a
    view of the same buffers), so nothing is decoded or re-encoded."""
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    return values.to_numpy(zero_copy_only=False)
