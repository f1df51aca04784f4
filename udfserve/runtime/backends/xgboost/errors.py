"""XGBoost's errors, at load and at each call, in the words a user or a client is told.

XGBoost raises one class, ``XGBoostError``, whose text starts with a time and a C++ source
location and ends with a native stack trace; a client is told the sentence in between.

At load (``load_error``): a file that is not a booster in XGBoost's JSON or UBJSON format
(truncated, another format, a pickle renamed), named with the file and what was expected.

At a call (``call_error``): the request reached a booster whose feature count it matched
(``tensor_conversion`` checked the shape), so a refusal of the data (a column count XGBoost
disagrees with) is ``InvalidInput`` naming the model; a failed allocation, on the host or on the
GPU (CUDA's or RMM's out of memory, ``MemoryError``, cupy's ``OutOfMemoryError``, which is one),
is ``DeviceOutOfMemory``, which the batcher splits on. Anything else is a ``BackendFault``,
logged once here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import xgboost
from xgboost.core import XGBoostError

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ServingError

logger = logging.getLogger(__name__)

MESSAGE_CHARS = 300
"""The most of XGBoost's message a client is told."""

_TIME_AND_SOURCE = re.compile(r"\[\d\d:\d\d:\d\d\]\s+\S+?:\d+:\s*")
_ALLOCATION_FAILED = (
    "out of memory",
    "out_of_memory",
    "cudaerrormemoryallocation",
    "bad_alloc",
    "bad allocation",
    "failed to allocate",
)
_DATA_REFUSED = ("n_features_data", "feature shape mismatch", "number of columns")
CALL_ERRORS: tuple[type[Exception], ...] = (XGBoostError, ValueError, MemoryError)
"""What ``inplace_predict`` raises: each becomes one of the runtime's errors."""


def short_message(error: BaseException) -> str:
    """XGBoost's message without its time, C++ source location and stack trace, on one line, what
    is not printable (bytes of the file it quotes) as ``?``."""
    text = str(error).split("Stack trace:", 1)[0]
    text = _TIME_AND_SOURCE.sub("", text)
    text = "".join(char if char.isprintable() else "?" for char in " ".join(text.split()))
    return text if len(text) <= MESSAGE_CHARS else f"{text[:MESSAGE_CHARS]}..."


def load_error(where: str, path: Path, error: BaseException) -> str:
    """What a user is told when XGBoost cannot load ``path`` as a booster. XGBoost's error quotes
    the start of the file, and a binary file (a pickle) makes that quote undecodable: the error
    is then a ``UnicodeDecodeError``, whose own words would say nothing of the file."""
    if isinstance(error, UnicodeDecodeError):
        error = XGBoostError("it is not XGBoost's JSON or UBJSON: XGBoost's own message quoted binary bytes")
    return (
        f"{where}: xgboost {xgboost.__version__} cannot load {path} ({short_message(error)}); expected a "
        "booster saved by Booster.save_model in XGBoost's JSON (model.json) or UBJSON (model.ubj) "
        "format: is it truncated, or another format?"
    )


def call_error(model_name: str, rows: int, error: Exception) -> ServingError:
    """The error a call of ``rows`` rows that raised ``error`` fails with."""
    said = short_message(error)
    lowered = said.lower()
    if isinstance(error, MemoryError) or any(marker in lowered for marker in _ALLOCATION_FAILED):
        return DeviceOutOfMemory(f"model {model_name!r}: out of memory running {rows} rows: {said}")
    if any(marker in lowered for marker in _DATA_REFUSED):
        return InvalidInput(f"model {model_name!r}: the booster refused the request's features: {said}")
    logger.error(
        "model %r: xgboost failed running %d rows", model_name, rows, exc_info=(type(error), error, None)
    )
    return BackendFault(
        f"model {model_name!r}: xgboost failed running {rows} rows: {type(error).__name__}: {said}"
    )
