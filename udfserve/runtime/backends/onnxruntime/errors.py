"""ONNX Runtime's errors, at load and at each call, in the words a user or a client is told.

At load (``load_error``), each refusal names the file and what was expected: a file that does
not parse as ONNX (truncated, or not ONNX at all), a graph using an operator this runtime does
not implement (a custom domain's op: custom-op libraries are never registered, so a graph runs
ONNX Runtime's own operators only), an opset newer than the runtime.

At a call (``call_error``), the request's values reached a graph whose shapes and dtypes they
matched (``tensor_conversion`` checked them), so what ONNX Runtime refuses is the values: an
id beyond a Gather's table, a shape a Reshape cannot take. ONNX Runtime raises these as
INVALID_ARGUMENT, or as a FAIL / RUNTIME_EXCEPTION "while running" a node: both are
``InvalidInput`` naming the model (the batcher then runs a merged call's requests one by one, so
only the request at fault is told). An allocation that failed is ``DeviceOutOfMemory``, which the
batcher splits on. Anything else is a ``BackendFault``, logged once here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ServingError

logger = logging.getLogger(__name__)

MESSAGE_CHARS = 300
"""The most of ONNX Runtime's message a client is told."""

_STATUS_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")
_SOURCE_LOCATION = re.compile(r"/\S+\.(?:cc|h|cpp):\d+\s+[^\n]*?\)\s+")
_ALLOCATION_FAILED = ("failed to allocate memory", "bad_alloc", "bad allocation", "out of memory")
CALL_ERRORS: tuple[type[Exception], ...] = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.RuntimeException,
    ort_state.NotImplemented,
    ort_state.EPFail,
    MemoryError,
)
"""What ``InferenceSession.run`` raises (ONNX Runtime's status classes derive from ``Exception``
only): each becomes one of the runtime's errors."""
_MISSING_OP = ("is not a registered function/op", "no op registered", "could not find an implementation")


def short_message(error: BaseException) -> str:
    """ONNX Runtime's message without its status prefix and C++ source locations, on one line."""
    text = _STATUS_PREFIX.sub("", str(error).strip())
    text = _SOURCE_LOCATION.sub("", text)
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else f"{text[:MESSAGE_CHARS]}..."


def load_error(where: str, path: Path, error: BaseException) -> str:
    """What a user is told when ONNX Runtime cannot open ``path`` as a session."""
    said = short_message(error)
    lowered = said.lower()
    runtime = f"onnxruntime {ort.__version__}"
    if isinstance(error, ort_state.InvalidProtobuf):
        return (
            f"{where}: {path} is not a readable ONNX model ({said}); expected a complete ONNX file "
            "(ModelProto): is it truncated, or not an ONNX export?"
        )
    if any(marker in lowered for marker in _MISSING_OP):
        return (
            f"{where}: {path} uses an operator {runtime} does not implement ({said}); expected a graph of "
            "standard ONNX operators: custom-op libraries are never registered by the server"
        )
    if "opset" in lowered:
        return f"{where}: {path} needs an opset {runtime} does not support ({said}); expected an older opset"
    return f"{where}: {runtime} cannot load {path}: {type(error).__name__}: {said}"


def call_error(model_name: str, rows: int, error: Exception) -> ServingError:
    """The error a call of ``rows`` rows that raised ``error`` fails with."""
    said = short_message(error)
    lowered = said.lower()
    if isinstance(error, MemoryError) or any(marker in lowered for marker in _ALLOCATION_FAILED):
        return DeviceOutOfMemory(f"model {model_name!r}: out of memory running {rows} rows: {said}")
    if isinstance(error, ort_state.InvalidArgument) or (
        isinstance(error, (ort_state.Fail, ort_state.RuntimeException)) and "while running" in lowered
    ):
        return InvalidInput(f"model {model_name!r}: the model refused the request's input values: {said}")
    logger.error(
        "model %r: onnxruntime failed running %d rows", model_name, rows, exc_info=(type(error), error, None)
    )
    return BackendFault(
        f"model {model_name!r}: onnxruntime failed running {rows} rows: {type(error).__name__}: {said}"
    )
