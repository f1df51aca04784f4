"""KServe v2 inference bodies over HTTP: a request read as the gRPC ``ModelInferRequest``, an
answer's tensors written as JSON or as binary tensor data.

A request body is a JSON object or, with the ``Inference-Header-Content-Length`` header, that many
bytes of JSON followed by the bytes of the inputs that declare ``"parameters": {"binary_data_size":
n}``, in the order of the inputs (Triton's binary tensor data extension). JSON ``data`` is a flat or
nested list in row-major order: numbers for the numeric datatypes, ``true`` and ``false`` for BOOL,
strings for BYTES (their UTF-8 bytes). Both become the raw contents of a gRPC request, so every
check after this module is the gRPC front end's, word for word; a request whose every input is
binary in a fixed-size datatype is offered first as arrays over the body itself (no copy), as the
native gRPC front end offers its decoded requests.

Which outputs an answer carries as binary data is read here too (``OutputFormat``); the answer's
body is written by ``answer_bodies``.

An input or a requested output may name a system shared-memory region instead (its
``shared_memory_region``, ``shared_memory_offset`` and ``shared_memory_byte_size`` parameters):
they go to the gRPC request as parameters, and the servicer reads and writes the region
(``kserve.shared_memory_tensors``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from udfserve import kserve_tensors as codec
from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.kserve.answers import (
    DecodedHead,
)
from udfserve.services.model_server.frontends.kserve.tensors import DecodedTensor

BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
SHARED_MEMORY_PREFIX = "shared_memory"
MAX_DIM = (1 << 63) - 1
"""A dimension is an int64 in the protocol."""


@dataclass(frozen=True)
class OutputFormat:
    """Which outputs an answer carries as binary tensor data, and which as JSON."""

    binary_default: bool = False
    binary_of: Mapping[str, bool] = field(default_factory=dict)

    def binary(self, name: str) -> bool:
        return self.binary_of.get(name, self.binary_default)


@dataclass
class _Input:
    name: str
    datatype: str
    shape: list[int]
    data: Any = None
    binary: memoryview | None = None
    shared: dict[str, Any] | None = None
    """The ``shared_memory_*`` parameters of an input in system shared memory."""


@dataclass
class InferBody:
    """One inference request as read from HTTP: what ``KServeServicer`` starts, and the answer's form."""

    head: DecodedHead
    form: OutputFormat
    decoded: list[DecodedTensor] | None
    """Every input binary in the model-independent fixed-size form, as arrays over the body: what
    ``start_decoded`` takes; None when any input needs the message's checks (JSON, BYTES, ...)."""
    output_names: list[str]
    _inputs: list[_Input]
    _outputs: list[tuple[str, dict[str, Any]]]

    def message(self) -> kpb.ModelInferRequest:
        """The request as the gRPC front end reads it: every input in ``raw_input_contents``, the
        outputs' parameters but ``binary_data`` (which only says how HTTP answers)."""
        head = self.head
        message = kpb.ModelInferRequest(
            model_name=head.model_name, model_version=head.model_version, id=head.id
        )
        for tensor in self._inputs:
            added = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            if tensor.shared is not None:  # read out of its region by the servicer
                for key, value in tensor.shared.items():
                    what = f"input {clip(tensor.name, 100)!r} parameter {key!r}"
                    _set_parameter(added.parameters[key], value, what)
            elif tensor.binary is not None:
                message.raw_input_contents.append(bytes(tensor.binary))
            else:
                what = f"{model_text(head.model_name)}: input {clip(tensor.name, 100)!r}"
                message.raw_input_contents.append(
                    json_data_to_raw(tensor.data, tensor.datatype, tensor.shape, what)
                )
        for name, parameters in self._outputs:
            output = message.outputs.add(name=name)
            for key, value in parameters.items():
                if key != BINARY_DATA:
                    _set_parameter(
                        output.parameters[key], value, f"output {clip(name, 100)!r} parameter {key!r}"
                    )
        return message


def model_text(model: str) -> str:
    return f"model '{clip(model, 100)}'"


def read_request(body: bytes, header_length: str | None, model: str, version: str) -> InferBody:
    """``body`` (decompressed) of an inference request for ``model`` and ``version`` (from the
    path); ``header_length`` is the ``Inference-Header-Content-Length`` header, if sent.
    ``InvalidInput`` naming what is wrong and what was expected."""
    prefix = f"{model_text(model)}: the request body"
    json_length = len(body)
    if header_length is not None:
        if not header_length.isascii() or not header_length.isdigit() or int(header_length) > len(body):
            raise InvalidInput(
                f"{prefix}: Inference-Header-Content-Length {clip(header_length, 40)!r} is not a number of "
                f"bytes within the body's {len(body)}; expected the length of the JSON that starts the body"
            )
        json_length = int(header_length)
    view = memoryview(body)
    try:
        request = json.loads(view[:json_length].tobytes() if json_length < len(body) else body)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"{prefix} is not JSON ({clip(str(exc), 200)}); expected a KServe v2 inference request object"
        ) from None
    if not isinstance(request, dict):
        raise InvalidInput(f"{prefix} is JSON {type(request).__name__}; expected an object with 'inputs'")
    request_id = request.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput(f"{prefix}: 'id' is {type(request_id).__name__}; expected a string")
    parameters = _object(request.get("parameters"), f"{prefix}: 'parameters'")
    binary_default = parameters.get(BINARY_DATA_OUTPUT, False)
    if not isinstance(binary_default, bool):
        raise InvalidInput(
            f"{prefix}: parameter {BINARY_DATA_OUTPUT!r} is not a boolean; expected true or false"
        )
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput(f"{prefix}: 'inputs' is {type(raw_inputs).__name__}; expected a list of tensors")
    inputs = _inputs(raw_inputs, view[json_length:], model_text(model))
    outputs = _outputs(request.get("outputs", []), model_text(model))
    form = OutputFormat(
        binary_default, {name: bool(p.get(BINARY_DATA, binary_default)) for name, p in outputs}
    )
    return InferBody(
        DecodedHead(request_id, model, version),
        form,
        _decoded(inputs, outputs),
        [name for name, _ in outputs],
        inputs,
        outputs,
    )


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} is {type(value).__name__}; expected an object")
    return value


def _inputs(raw_inputs: list[Any], binary: memoryview, model: str) -> list[_Input]:
    inputs = []
    offset = 0
    for index, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise InvalidInput(f"{model}: input {index} is {type(raw).__name__}; expected an object")
        name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise InvalidInput(f"{model}: input {index} lacks a string 'name' and 'datatype'; expected both")
        what = f"{model}: input {clip(name, 100)!r}"
        if not isinstance(shape, list) or not all(
            isinstance(dim, int) and not isinstance(dim, bool) and -1 <= dim <= MAX_DIM for dim in shape
        ):
            raise InvalidInput(f"{what}: 'shape' is {clip(shape, 80)}; expected a list of integers")
        parameters = _object(raw.get("parameters"), f"{what}: 'parameters'")
        shared = {key: value for key, value in parameters.items() if key.startswith(SHARED_MEMORY_PREFIX)}
        if shared:
            if "data" in raw or BINARY_DATA_SIZE in parameters:
                raise InvalidInput(f"{what} names a shared-memory region and carries data; expected one")
            inputs.append(_Input(name, datatype, shape, shared=shared))
            continue
        size = parameters.get(BINARY_DATA_SIZE)
        if size is None:
            if "data" not in raw:
                raise InvalidInput(
                    f"{what} has neither 'data' nor parameter {BINARY_DATA_SIZE!r}; expected one"
                )
            inputs.append(_Input(name, datatype, shape, data=raw["data"]))
            continue
        if "data" in raw:
            raise InvalidInput(f"{what} has both 'data' and parameter {BINARY_DATA_SIZE!r}; expected one")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{what}: {BINARY_DATA_SIZE} {clip(size, 40)} is not a number of bytes")
        if offset + size > len(binary):
            raise InvalidInput(
                f"{what}: {BINARY_DATA_SIZE} {size} reaches beyond the {len(binary)} bytes after the JSON "
                f"(from byte {offset} of them); expected the binary data of the inputs in their order"
            )
        inputs.append(_Input(name, datatype, shape, binary=binary[offset : offset + size]))
        offset += size
    if offset != len(binary):
        raise InvalidInput(
            f"{model}: the request body holds {len(binary) - offset} bytes beyond the JSON and the binary "
            f"data its inputs declare ({offset} bytes); expected Inference-Header-Content-Length to count "
            "the JSON, and each binary input's binary_data_size its bytes"
        )
    return inputs


def _outputs(raw_outputs: Any, model: str) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(raw_outputs, list):
        raise InvalidInput(f"{model}: 'outputs' is {type(raw_outputs).__name__}; expected a list")
    outputs = []
    for index, raw in enumerate(raw_outputs):
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str):
            raise InvalidInput(f"{model}: output {index} lacks a string 'name'; expected one")
        what = f"{model}: requested output {clip(name, 100)!r}"
        parameters = _object(raw.get("parameters"), f"{what}: 'parameters'")
        if not isinstance(parameters.get(BINARY_DATA, False), bool):
            raise InvalidInput(f"{what}: parameter {BINARY_DATA!r} is not a boolean; expected true or false")
        outputs.append((name, parameters))
    return outputs


def _decoded(inputs: list[_Input], outputs: list[tuple[str, dict[str, Any]]]) -> list[DecodedTensor] | None:
    """The inputs as arrays over the body, when every one is binary, of a fixed-size datatype and
    as many bytes as its shape holds, and no output asks for more than its form; else None."""
    if any(set(parameters) - {BINARY_DATA} for _, parameters in outputs):
        return None
    tensors: list[DecodedTensor] = []
    for tensor in inputs:
        dtype = codec.NUMPY_DTYPE_OF.get(tensor.datatype)
        if (
            tensor.binary is None
            or dtype is None
            or dtype.kind == "O"
            or not tensor.shape
            or min(tensor.shape) < 0
        ):
            return None
        count = math.prod(tensor.shape)
        if count * dtype.itemsize != len(tensor.binary) or not np.little_endian:
            return None
        try:
            array = np.frombuffer(tensor.binary, dtype=dtype, count=count).reshape(tensor.shape)
        except ValueError:  # more dimensions than numpy holds: the message's checks name the input
            return None
        tensors.append((tensor.name, tensor.datatype, tuple(tensor.shape), array))
    return tensors


def json_data_to_raw(data: Any, datatype: str, shape: list[int], what: str) -> bytes:
    """JSON ``data`` (flat or nested, row-major) of ``datatype`` and ``shape`` as raw contents."""
    try:
        count = codec.element_count(shape, what)
        if datatype == "BYTES":
            values = _strings(data, what)
            if len(values) != count:
                raise InvalidInput(f"{what}: shape {shape} holds {count} elements, 'data' has {len(values)}")
            array = np.empty(count, dtype=object)
            array[:] = values
            return codec.serialize_bytes(array, what)
        codec.numpy_dtype(datatype, what)
        try:
            numbers: np.ndarray | None = np.asarray(data)
        except (ValueError, OverflowError):
            numbers = None
        if numbers is None or numbers.dtype.kind not in "biuf":
            kind = "booleans" if datatype == "BOOL" else "numbers"
            raise InvalidInput(
                f"{what}: 'data' is not a list of {kind} of one nesting depth; expected {datatype} values, "
                "flat or nested row by row"
            )
        if numbers.size != count:
            raise InvalidInput(f"{what}: shape {shape} holds {count} elements, 'data' has {numbers.size}")
        return codec.tensor_to_raw(codec.coerce(numbers.reshape(-1), datatype, f"{what} ('data' in JSON)"))
    except codec.KServeCodecError as exc:
        raise InvalidInput(str(exc)) from None


def _strings(data: Any, what: str) -> list[bytes]:
    """The strings of a BYTES input's JSON ``data``, flattened, as UTF-8 bytes."""
    values: list[bytes] = []
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                values.append(item.encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate, escaped in the JSON as \ud800
                raise InvalidInput(
                    f"{what}: 'data' element {len(values)} is not Unicode text (a lone surrogate); expected "
                    "text, or other bytes as binary data"
                ) from None
        elif isinstance(item, list):
            pending.extend(reversed(item))
        else:
            raise InvalidInput(
                f"{what}: 'data' holds a {type(item).__name__}; expected strings for BYTES (send other bytes "
                "as binary data)"
            )
    return values


def _set_parameter(parameter: kpb.InferParameter, value: Any, what: str) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    elif isinstance(value, str):
        parameter.string_param = value
    else:
        raise InvalidInput(f"{what} is {clip(value, 40)}; expected a boolean, an int64, a number or a string")
