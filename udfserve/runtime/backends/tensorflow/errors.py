"""TensorFlow's errors of a call, in the words a client is told.

TensorFlow wraps what went wrong in a graph trace: the line of every Python frame that defined
the failing node, server paths included, and the node's name. A client is told the line that
says what went wrong (``indices[1] = 99 is not in [0, 16)``), never the trace.

- ``InvalidArgumentError`` is the graph refusing values of its input (an id beyond an embedding
  table, a shape a reshape cannot take): the request's fault, ``InvalidInput``. A merged call
  that fails this way is run again request by request (``core/batching/recovery``), so only the
  request whose own call fails is told.
- ``ResourceExhaustedError`` is ``DeviceOutOfMemory``, which the batcher splits on.
- Any other error of the framework is a ``BackendFault``, its trace logged once here (the log
  rate-limits tracebacks).
"""

from __future__ import annotations

import logging
import re

import tensorflow as tf

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ServingError

logger = logging.getLogger(__name__)

MESSAGE_CHARS = 300
"""The most of TensorFlow's line a client is told."""

_NODE_NAME = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_OP_NAME = re.compile(r"\s*\[Op:[^\]]*\]")
_TRACE_HEADERS = ("Graph execution error", "Detected at node", "File ")


def short_message(message: str) -> str:
    """The line of TensorFlow's message that says what went wrong, without the trace around it."""
    lines = [line for line in message.splitlines() if line.strip()]
    said = [line for line in lines if not line[0].isspace() and not line.strip().startswith(_TRACE_HEADERS)]
    line = said[-1] if said else (lines[0].strip() if lines else "")
    line = _OP_NAME.sub("", _NODE_NAME.sub("", line)).strip()
    return line if len(line) <= MESSAGE_CHARS else f"{line[:MESSAGE_CHARS]}..."


def oom_line(message: str) -> str:
    """The line of a resource-exhausted error that says what did not fit; TensorFlow wraps it in
    a graph trace and a hint many lines long."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("OOM")), short_message(message))


def call_error(model_name: str, rows: int, error: tf.errors.OpError) -> ServingError:
    """The error a call of ``rows`` rows that raised ``error`` fails with."""
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return DeviceOutOfMemory(
            f"model {model_name!r}: out of memory running {rows} rows: {oom_line(error.message)}"
        )
    if isinstance(error, tf.errors.InvalidArgumentError):
        return InvalidInput(
            f"model {model_name!r}: the model refused the request's input values: "
            f"{short_message(error.message)}"
        )
    logger.error(
        "model %r: tensorflow failed running %d rows", model_name, rows, exc_info=(type(error), error, None)
    )
    return BackendFault(
        f"model {model_name!r}: tensorflow failed running {rows} rows: {type(error).__name__}: "
        f"{short_message(error.message)}"
    )
