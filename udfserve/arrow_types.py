"""The Arrow column types both protocols accept, named once so the server and the codec agree."""

from __future__ import annotations

import pyarrow as pa


def is_list_type(arrow_type: pa.DataType) -> bool:
    """A level of nesting a tensor dimension can come from: list, large list or fixed-size list."""
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def is_string_type(arrow_type: pa.DataType) -> bool:
    """Values a string tensor takes as bytes: text (as its UTF-8 bytes) or binary of any width."""
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
    )
