"""PyTorch's errors of a call, in the words a client is told.

Torch raises plain Python exceptions: which of them are the request's fault is read from their
type and, for ``RuntimeError``, from the words ATen's checks use.

- ``torch.OutOfMemoryError`` (CUDA) and the CPU allocator's "can't allocate memory" are
  ``DeviceOutOfMemory``: the batcher splits the call in halves.
- ``IndexError`` (an id beyond an embedding table), ``ValueError``, an export guard failing
  (``AssertionError``: a shape the program was not exported for), and a ``RuntimeError`` about
  shapes, sizes, dtypes or indices are the input's: ``InvalidInput``. A merged call failing this
  way is run again request by request (``core/batching/recovery``), so only the request whose own
  call fails is told.
- Anything else is a ``BackendFault``, its trace logged once here.
"""

from __future__ import annotations

import logging
import re

import torch

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ServingError

logger = logging.getLogger(__name__)

MESSAGE_CHARS = 300
"""The most of torch's message a client is told."""

_INPUT_WORDS = re.compile(
    r"shape|size|dimension|dim |index|out of (range|bounds)|dtype|expected .* but got|guard|must match",
    re.IGNORECASE,
)
_CPU_OOM = re.compile(r"can't allocate memory|out of memory", re.IGNORECASE)


def short_message(error: BaseException) -> str:
    """The first line of torch's message, without the C++ trace some errors carry."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    return line if len(line) <= MESSAGE_CHARS else f"{line[:MESSAGE_CHARS]}..."


def call_error(model_name: str, rows: int, error: Exception) -> ServingError:
    """The error a call of ``rows`` rows that raised ``error`` fails with."""
    said = short_message(error)
    if isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and _CPU_OOM.search(said)
    ):
        return DeviceOutOfMemory(f"model {model_name!r}: out of memory running {rows} rows: {said}")
    if isinstance(error, (IndexError, ValueError, AssertionError)) or (
        isinstance(error, RuntimeError) and _INPUT_WORDS.search(said)
    ):
        return InvalidInput(f"model {model_name!r}: the model refused the request's input values: {said}")
    logger.error(
        "model %r: torch failed running %d rows", model_name, rows, exc_info=(type(error), error, None)
    )
    return BackendFault(
        f"model {model_name!r}: torch failed running {rows} rows: {type(error).__name__}: {said}"
    )
