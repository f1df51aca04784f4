"""KServe v2 tensors: a request's input tensors checked against the model and read as arrays,
and the model's outputs as the tensors to answer; what both KServe front ends decode and encode.

The first dimension of every input is the batch (rows) and must agree between inputs; the
others must equal the model's per-row shape (``-1`` free). A per-row scalar is advertised the
way Triton writes it, ``dims: [1]`` reshaped to ``[]``, so ``[rows, 1]`` and ``[rows]`` are both
accepted and outputs come back as ``[rows, 1]``. Datatypes are coerced to the model's as on the
Arrow path: float inputs accept integer and floating-point values (FP64 narrowed to FP32),
integer inputs accept integers that fit, BOOL only BOOL. A ``string`` input (``tf.string``) is a
BYTES tensor, raw (each element a 4-byte little-endian length and its bytes, as Triton encodes
it) or in ``contents.bytes_contents``; BYTES for a numeric input, or numbers for a string input,
are refused naming the input and both datatypes. Outputs are answered as raw contents.

The conversions themselves are ``udfserve.kserve_tensors``'s, the rules the Spark client also uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from udfserve import kserve_tensors as codec
from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import BackendFault, InvalidInput
from udfserve.runtime.tensor_spec import TensorSpec, numpy_dtype

DATATYPE_OF_DTYPE = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "string": "BYTES",
}
"""Every dtype of ``config.SUPPORTED_DTYPES`` as a KServe datatype."""


DecodedTensor: TypeAlias = "tuple[str, str, tuple[int, ...], np.ndarray]"
"""An input a native front end decoded: name, datatype, shape (rows first), and the array of that
shape over the request's raw contents."""


def advertised_dims(spec: TensorSpec) -> list[int]:
    """Per-row dims as Triton writes them: a per-row scalar is ``[1]`` (reshaped to ``[]``)."""
    return list(spec.shape) if spec.shape else [1]


def _shape_matches(received: tuple[int, ...], spec: TensorSpec) -> bool:
    if not spec.shape:
        return received in ((), (1,))
    return len(received) == len(spec.shape) and all(
        wanted in (codec.FREE_DIM, got) for wanted, got in zip(spec.shape, received, strict=True)
    )


def _check_datatype(datatype: str, spec: TensorSpec, what: str) -> None:
    """Refuse before decoding what no coercion can turn into the model's dtype."""
    expected = DATATYPE_OF_DTYPE[spec.dtype]
    if datatype == "BYTES" and expected != "BYTES":
        raise InvalidInput(
            f"{what}: expected datatype {expected}, received BYTES; this input takes numbers, not strings"
        )
    if expected == "BYTES" and datatype != "BYTES" and datatype in codec.NUMPY_DTYPE_OF:
        raise InvalidInput(
            f"{what}: expected datatype BYTES, received {datatype}; this input takes strings, not numbers"
        )
    if datatype not in codec.NUMPY_DTYPE_OF:
        raise InvalidInput(
            f"{what}: expected datatype {expected}, received {datatype!r}, which is not a KServe datatype "
            f"udfserve reads ({', '.join(codec.NUMPY_DTYPE_OF)})"
        )


@dataclass(frozen=True)
class _PlannedInput:
    """One input of a model as a request tensor must carry it, worked out once per model."""

    spec: TensorSpec
    datatype: str
    dtype: np.dtype
    scalar: bool


@dataclass(frozen=True)
class InputPlan:
    """What reading one loaded model's requests needs, worked out once per model rather than per
    request: the request path of a small request is mostly such bookkeeping."""

    by_name: dict[str, _PlannedInput]


def plan_of(specs: tuple[TensorSpec, ...]) -> InputPlan:
    """The plan of a model of these inputs (its caller keeps one per loaded model)."""
    by_name = {}
    for spec in specs:
        datatype = DATATYPE_OF_DTYPE[spec.dtype]
        by_name[spec.name] = _PlannedInput(spec, datatype, codec.NUMPY_DTYPE_OF[datatype], not spec.shape)
    return InputPlan(by_name)


def request_to_inputs(
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...], plan: InputPlan | None = None
) -> tuple[dict[str, np.ndarray], int]:
    """Check the request's tensors against the model's inputs; arrays of the declared dtype, and rows.

    The common request (raw contents of the model's own datatypes, every input once) is read
    without building any message; anything else takes the checks that explain what is wrong.
    """
    if plan is None:
        plan = plan_of(specs)
    tensors = request.inputs
    raw = request.raw_input_contents
    if len(raw) == len(tensors) == len(plan.by_name):
        arrays: dict[str, np.ndarray] = {}
        rows = -1
        for index, tensor in enumerate(tensors):
            item = plan.by_name.get(tensor.name)
            if item is None or tensor.datatype != item.datatype or item.datatype == "BYTES":
                break
            shape = tuple(tensor.shape)
            if not shape or (rows >= 0 and shape[0] != rows) or not _shape_matches(shape[1:], item.spec):
                break
            data = raw[index]
            count = 1
            for dim in shape:
                count *= dim
            if min(shape) < 0 or count * item.dtype.itemsize != len(data) or tensor.HasField("contents"):
                break
            array = np.frombuffer(data, dtype=item.dtype, count=count)
            arrays[tensor.name] = array.reshape(shape[0]) if item.scalar else array.reshape(shape)
            rows = shape[0]
        else:
            if len(arrays) == len(tensors) and _LITTLE_ENDIAN:
                return arrays, max(rows, 0)
    return _checked_inputs(request, model, specs, plan)


_LITTLE_ENDIAN = np.little_endian


def decoded_to_inputs(
    tensors: Sequence[DecodedTensor], plan: InputPlan
) -> tuple[dict[str, np.ndarray], int] | None:
    """``request_to_inputs``'s common case over tensors decoded already: every input once, in the
    model's own datatype and per-row shape; None for anything else."""
    if len(tensors) != len(plan.by_name) or not _LITTLE_ENDIAN:
        return None
    arrays: dict[str, np.ndarray] = {}
    rows = -1
    for name, datatype, shape, array in tensors:
        item = plan.by_name.get(name)
        if item is None or datatype != item.datatype or name in arrays or item.datatype == "BYTES":
            return None
        if (rows >= 0 and shape[0] != rows) or not _shape_matches(shape[1:], item.spec):
            return None
        arrays[name] = array.reshape(shape[0]) if item.scalar else array
        rows = shape[0]
    return arrays, rows


def _checked_inputs(
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...], plan: InputPlan
) -> tuple[dict[str, np.ndarray], int]:
    prefix = f"model {model!r}: "
    expected = [spec.name for spec in specs]
    received = [tensor.name for tensor in request.inputs]
    if sorted(received) != sorted(expected) or len(set(received)) != len(received):
        raise InvalidInput(f"{prefix}expected exactly the inputs {expected}, received {received}")
    raw = request.raw_input_contents
    typed = next((tensor.name for tensor in request.inputs if tensor.HasField("contents")), None)
    if raw and typed is not None:
        # Triton's words, which clients written against Triton look for.
        raise InvalidInput(
            f"contents field must not be specified when using raw_input_contents for {typed!r} for model "
            f"{model!r}: expected typed contents or raw_input_contents for the whole request, not both"
        )
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"{prefix}received {len(raw)} raw_input_contents for {len(request.inputs)} inputs; expected one "
            "per input, in the order of the inputs"
        )
    arrays: dict[str, np.ndarray] = {}
    rows_of: dict[str, int] = {}
    for index, tensor in enumerate(request.inputs):
        spec = plan.by_name[tensor.name].spec
        what = f"{prefix}input {tensor.name!r}"
        _check_datatype(tensor.datatype, spec, what)
        shape = tuple(int(dim) for dim in tensor.shape)
        if not shape or not _shape_matches(shape[1:], spec):
            raise InvalidInput(
                f"{what}: expected shape {[-1, *advertised_dims(spec)]} (rows, then the per-row shape; "
                f"-1 is free), received shape {list(shape)}"
            )
        try:
            if raw:
                array = codec.tensor_from_raw(raw[index], tensor.datatype, shape, what)
            else:
                array = codec.tensor_from_contents(tensor.contents, tensor.datatype, shape, what)
            if not spec.shape:
                array = array.reshape(shape[0])
            arrays[tensor.name] = codec.coerce(array, DATATYPE_OF_DTYPE[spec.dtype], what)
        except codec.KServeCodecError as exc:
            raise InvalidInput(str(exc)) from None
        rows_of[tensor.name] = shape[0]
    if len(set(rows_of.values())) > 1:
        raise InvalidInput(
            f"{prefix}expected the same batch dimension (rows) in every input, received {rows_of}"
        )
    return arrays, next(iter(rows_of.values()), 0)


OutputTensor: TypeAlias = "tuple[str, str, list[int], np.ndarray | bytes]"
"""An answered output as both front ends send it: name, datatype, shape, and its raw contents (a
C-contiguous little-endian array, or the encoded bytes of a BYTES tensor)."""


def outputs_to_tensors(
    outputs: dict[str, np.ndarray], specs: tuple[TensorSpec, ...], rows: int
) -> tuple[list[OutputTensor], int]:
    """The output tensors to answer, checked against the model's outputs; and their raw bytes."""
    tensors: list[OutputTensor] = []
    total_bytes = 0
    for spec in specs:
        array = outputs.get(spec.name)
        if array is None:
            raise BackendFault(f"backend returned no output {spec.name!r}; received {sorted(outputs)}")
        if array.shape[0] != rows or not _shape_matches(tuple(array.shape[1:]), spec):
            raise BackendFault(
                f"backend output {spec.name!r} has shape {list(array.shape)}; expected [{rows}, "
                f"*{list(spec.shape)}]"
            )
        dtype = numpy_dtype(spec.dtype)
        raw: np.ndarray | bytes
        if array.dtype == dtype and dtype.kind != "O" and _LITTLE_ENDIAN and array.dtype.byteorder in "=|<":
            raw = np.ascontiguousarray(array)
        else:
            raw = codec.tensor_to_raw(np.asarray(array, dtype=dtype))
        shape = [rows, *array.shape[1:]] if spec.shape else [rows, 1]
        tensors.append((spec.name, DATATYPE_OF_DTYPE[spec.dtype], shape, raw))
        total_bytes += raw.nbytes if isinstance(raw, np.ndarray) else len(raw)
    return tensors, total_bytes


def outputs_named(names: Sequence[str], specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...] | None:
    """The outputs requested by name only (all of them for none); None if one is not an output."""
    if not names:
        return specs
    by_name = {spec.name: spec for spec in specs}
    chosen = [by_name.get(name) for name in names]
    return None if None in chosen else tuple(spec for spec in chosen if spec is not None)


def requested_outputs(
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    """The outputs the request asks for (all of them for none), refusing an unknown one and what
    asks for classification, which only Triton serves (an output in system shared memory is
    ``shared_memory_tensors``'s, checked before this)."""
    if not request.outputs:
        return specs
    by_name = {spec.name: spec for spec in specs}
    chosen = []
    for output in request.outputs:
        what = f"model {model!r}: requested output {output.name!r}"
        if output.name not in by_name:
            raise InvalidInput(f"{what} is not an output of the model; expected one of {list(by_name)}")
        if "classification" in output.parameters:
            raise InvalidInput(
                f"{what}: parameters {sorted(output.parameters)} ask for classification, which udfserve "
                "does not serve; expected plain tensors"
            )
        chosen.append(by_name[output.name])
    return tuple(chosen)


MAX_VERSION_DIGITS = 18
"""A version is a positive int64 in Triton's repository, at most 18 digits here: longer strings
are refused before Python's int() (which refuses more than 4,300 digits with a ValueError)."""


def parse_version(version: str, model: str) -> int:
    """A request's ``model_version`` (or ``version``) as the model table takes it: 0 (the served
    one) for none; ``InvalidInput`` naming the field for anything but at most 18 digits."""
    if not version:
        return 0
    if not (version.isascii() and version.isdigit()) or len(version) > MAX_VERSION_DIGITS:
        # Triton's words first ("failed to get model version from specified version string"):
        # clients written against Triton look for them.
        raise InvalidInput(
            f"model '{clip(model, 100)}': failed to get model version from specified version string "
            f"'{clip(version, 40)}' ({len(version)} characters): model_version is not a version number; "
            f"expected at most {MAX_VERSION_DIGITS} digits, or empty for the served version"
        )
    return int(version)
