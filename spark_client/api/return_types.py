"""The Spark types a model's answers go back as, and the check that a chosen ``return_type`` can
hold them.

Spark converts what a UDF returns to its declared type without asking: a pandas UDF declared
``array<int>`` over a float model truncates every probability to 0, ``array<boolean>`` makes them
all true, and an Arrow UDF turns them into strings. So ``remote_predict`` refuses, in the driver
and naming the model, a type that would change what the model said: one that has another nesting
than the output's shape, another kind of value, or a narrower integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from udfserve.spark_client.common.model_spec import ModelSpec, Tensor
from udfserve.spark_client.common.versions import VERSION_FIELD, check_version_field, wants_version

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

FLOAT_DTYPES = ("float16", "float32", "float64")
INTEGER_BITS = {"int8": 8, "uint8": 16, "int16": 16, "int32": 32, "int64": 64}
"""Bits a Spark integer type needs to hold each integer dtype (uint8 takes a signed 16)."""


def spark_return_type(spec: ModelSpec) -> DataType:
    """What the model declares: a scalar, an array for a vector, a struct of several outputs."""
    from pyspark.sql.types import StructField, StructType

    if len(spec.outputs) == 1:
        return spark_type(spec.outputs[0])
    return StructType([StructField(t.name, spark_type(t), nullable=True) for t in spec.outputs])


@dataclass(frozen=True)
class ResolvedReturn:
    """A UDF's return type, whether it is a struct, and whether it holds the version of each row."""

    return_type: DataType | str
    as_struct: bool
    with_version: bool

    @property
    def fields(self) -> list[str] | None:
        """The struct's field names in its order, when known in the driver."""
        if not self.as_struct or isinstance(self.return_type, str):
            return None
        return [field.name for field in self.return_type.fields]  # type: ignore[attr-defined]


def resolve_return_type(
    spec: ModelSpec, return_type: DataType | str | None, session: Any, with_version: bool
) -> ResolvedReturn:
    """The return type of ``remote_predict``: the model's own (with a ``model_version`` field when
    ``with_version``), or the one given, refused when it cannot hold the answers unchanged."""
    given = None if return_type is None else parsed(return_type, session)
    versioned = wants_version(spec, given, with_version)
    resolved: DataType | str
    if given is None:
        resolved = versioned_return_type(spec) if versioned else spark_return_type(spec)
    else:
        resolved = given
    if versioned:
        check_version_field(spec, resolved)
    as_struct = is_struct(resolved)
    check_return_type(spec, resolved, as_struct, versioned)
    return ResolvedReturn(resolved, as_struct, versioned)


def versioned_return_type(spec: ModelSpec) -> DataType:
    """The model's return type with the version of each row: a struct of the outputs, then
    ``model_version bigint``."""
    from pyspark.sql.types import LongType, StructField, StructType

    fields = [StructField(t.name, spark_type(t), nullable=True) for t in spec.outputs]
    return StructType([*fields, StructField(VERSION_FIELD, LongType(), nullable=True)])


def spark_type(tensor: Tensor) -> DataType:
    from pyspark.sql import types

    scalar: DataType = {
        "float16": types.FloatType,
        "float32": types.FloatType,
        "float64": types.DoubleType,
        "int8": types.ByteType,
        "int16": types.ShortType,
        "int32": types.IntegerType,
        "int64": types.LongType,
        "uint8": types.ShortType,
        "bool": types.BooleanType,
        "string": types.BinaryType,
    }[tensor.dtype]()
    for _ in tensor.shape:
        scalar = types.ArrayType(scalar, containsNull=False)
    return scalar


def parsed(return_type: DataType | str, session: Any) -> DataType | str:
    """A DDL string as ``session`` parses it ("score float, embedding array<float>" is a struct
    too); with no session it stays a string, for Spark to parse when the job runs."""
    if isinstance(return_type, str) and session is not None:
        from pyspark.sql.types import DataType

        return DataType.fromDDL(return_type)
    return return_type


def is_struct(return_type: DataType | str) -> bool:
    """Only the ``struct<...>`` form of an unparsed DDL string can be recognised."""
    if isinstance(return_type, str):
        return return_type.strip().lower().startswith("struct")
    from pyspark.sql.types import StructType

    return isinstance(return_type, StructType)


def check_return_type(
    spec: ModelSpec, return_type: DataType | str, as_struct: bool, with_version: bool = False
) -> None:
    """Refuse a ``return_type`` that cannot hold the model's answers unchanged.

    An unparsed DDL string (no active session) is left to Spark. A struct's fields are filled by
    name from the outputs (and ``model_version``, checked by ``versions.check_version_field``,
    when ``with_version``); a single column holds the model's only output.
    """
    if len(spec.outputs) > 1 and not as_struct:
        raise ValueError(
            f"model {spec.name!r} has outputs {list(spec.output_names)}; expected a struct return type with "
            f"those fields, received {return_type!r}"
        )
    if isinstance(return_type, str):
        return
    if not as_struct:
        _check_output(spec, spec.outputs[0], return_type, where="the return type")
        return
    fields = list(return_type.fields)  # type: ignore[attr-defined]
    if with_version:
        fields = [field for field in fields if field.name != VERSION_FIELD]
    unknown = [field.name for field in fields if field.name not in spec.output_names]
    if unknown:
        # An Arrow UDF would answer null in such a field on every row; a pandas UDF fails every task.
        raise ValueError(
            f"model {spec.name!r}: the return type's field(s) {unknown} are not outputs of the model; "
            f"expected struct fields named after its outputs {list(spec.output_names)}"
        )
    outputs = dict(zip(spec.output_names, spec.outputs, strict=True))
    for field in fields:
        _check_output(
            spec, outputs[field.name], field.dataType, where=f"the return type's field {field.name!r}"
        )


def _check_output(spec: ModelSpec, tensor: Tensor, declared: DataType, where: str) -> None:
    from pyspark.sql.types import ArrayType

    leaf = declared
    depth = 0
    while isinstance(leaf, ArrayType):
        leaf = leaf.elementType
        depth += 1
    if depth != len(tensor.shape) or not _holds(tensor.dtype, leaf):
        raise ValueError(
            f"model {spec.name!r}: {where} is {declared.simpleString()}, which cannot hold output "
            f"{tensor.name!r} ({tensor.dtype}, per-row shape {list(tensor.shape)}) unchanged; expected "
            f"{_expected(tensor)}"
        )


def _holds(dtype: str, leaf: DataType) -> bool:
    """Whether every value of ``dtype`` keeps its kind and value as ``leaf`` (floats may narrow)."""
    from pyspark.sql import types

    if dtype in FLOAT_DTYPES:
        return isinstance(leaf, types.FloatType | types.DoubleType)
    if dtype == "bool":
        return isinstance(leaf, types.BooleanType)
    if dtype == "string":
        return isinstance(leaf, types.BinaryType | types.StringType)
    bits = INTEGER_BITS[dtype]
    integer_bits: dict[type[DataType], int] = {
        types.ByteType: 8,
        types.ShortType: 16,
        types.IntegerType: 32,
        types.LongType: 64,
    }
    if type(leaf) in integer_bits:
        return integer_bits[type(leaf)] >= bits
    # a float holds an integer exactly up to its mantissa: 24 bits for float, 53 for double
    if isinstance(leaf, types.FloatType):
        return bits <= 16
    if isinstance(leaf, types.DoubleType):
        return bits <= 32
    return False


def _expected(tensor: Tensor) -> str:
    """The types ``_holds`` accepts for the output, as DDL, nested as the output's shape."""
    from pyspark.sql import types

    candidates = (
        types.ByteType, types.ShortType, types.IntegerType, types.LongType, types.FloatType,
        types.DoubleType, types.BooleanType, types.BinaryType, types.StringType,
    )  # fmt: skip
    leaves = [leaf().simpleString() for leaf in candidates if _holds(tensor.dtype, leaf())]
    return " or ".join(_nest(leaf, len(tensor.shape)) for leaf in leaves)


def _nest(leaf: str, depth: int) -> str:
    for _ in range(depth):
        leaf = f"array<{leaf}>"
    return leaf
