"""Tensors in system shared memory: a request's inputs read out of the regions they name, and the
outputs a client asked for in a region written there, by Triton's parameters
(``shared_memory_region``, ``shared_memory_offset``, ``shared_memory_byte_size``).

An input in a region is read (``SystemSharedMemory.read``, a copy) into the request before the
usual checks, so it is checked and decoded exactly as one sent inline. In ``raw_input_contents``
the inputs sent inline keep their order, those in shared memory taking no entry, as the Triton
clients send them. An output written to a region comes back in the response with its name,
datatype and shape and its ``shared_memory_region`` and ``shared_memory_byte_size`` (the bytes
written) parameters, and no contents: an empty ``raw_output_contents`` entry, so that every output
keeps its index (Triton's C++ client reads one entry per output, whichever way it came).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.kserve.system_shared_memory import SystemSharedMemory
from udfserve.services.model_server.frontends.kserve.tensors import OutputTensor

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PREFIX = "shared_memory"


@dataclass(frozen=True)
class RegionRange:
    """Where a tensor lies: a region's name, an offset in the region, a number of bytes."""

    region: str
    offset: int
    byte_size: int


def region_range(parameters: Mapping[str, kpb.InferParameter], what: str) -> RegionRange | None:
    """The range a tensor's parameters name, None when they name none; ``InvalidInput`` for
    parameters that are not Triton's three, or of the wrong type."""
    keys = [key for key in parameters if key.startswith(PREFIX)]
    if not keys:
        return None
    unknown = sorted(set(keys) - {REGION, OFFSET, BYTE_SIZE})
    if unknown or REGION not in parameters or BYTE_SIZE not in parameters:
        raise InvalidInput(
            f"{what}: parameters {sorted(keys)}; expected {REGION!r} (a string) and "
            f"{BYTE_SIZE!r} (an int64), and {OFFSET!r} (an int64) if not 0"
        )

    def integer(key: str) -> int:
        parameter = parameters[key]
        choice = parameter.WhichOneof("parameter_choice")
        if choice not in ("int64_param", "uint64_param"):
            raise InvalidInput(f"{what}: parameter {key!r} is a {choice}; expected an int64")
        return int(getattr(parameter, choice))

    region = parameters[REGION]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInput(f"{what}: parameter {REGION!r} is not a string; expected the region's name")
    offset = integer(OFFSET) if OFFSET in parameters else 0
    return RegionRange(region.string_param, offset, integer(BYTE_SIZE))


def uses_shared_memory(message: kpb.ModelInferRequest) -> bool:
    """Whether any input or requested output of ``message`` names shared memory."""
    for tensors in (message.inputs, message.outputs):
        for tensor in tensors:
            if tensor.parameters and any(key.startswith(PREFIX) for key in tensor.parameters):
                return True
    return False


def read_inputs(
    message: kpb.ModelInferRequest, regions: SystemSharedMemory, model: str
) -> kpb.ModelInferRequest:
    """``message`` with every input in ``raw_input_contents``: those in shared memory read out of
    their regions, at most ``max_request_bytes`` in all; the others as the client sent them."""
    resolved = kpb.ModelInferRequest(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    resolved.outputs.extend(message.outputs)
    for key, value in message.parameters.items():
        resolved.parameters[key].CopyFrom(value)
    inline = list(message.raw_input_contents)
    inline_count = sum(
        1 for tensor in message.inputs if not any(key.startswith(PREFIX) for key in tensor.parameters)
    )
    if inline and len(inline) != inline_count:
        raise InvalidInput(
            f"model {clip(model)!r}: received {len(inline)} raw_input_contents for {inline_count} "
            "inputs not in shared memory; expected one per such input, in their order"
        )
    total = 0
    budget = regions.bounds.max_request_bytes
    next_inline = 0
    for tensor in message.inputs:
        what = f"model {clip(model)!r}: input {clip(tensor.name, 100)!r}"
        copy = resolved.inputs.add()
        copy.CopyFrom(tensor)
        wanted = region_range(tensor.parameters, what)
        if wanted is None:
            if not inline:
                raise InvalidInput(
                    f"{what} carries typed contents while other inputs are in shared memory; expected its "
                    "bytes in raw_input_contents"
                )
            resolved.raw_input_contents.append(inline[next_inline])
            next_inline += 1
            continue
        for key in [key for key in copy.parameters if key.startswith(PREFIX)]:
            del copy.parameters[key]
        if copy.HasField("contents"):
            raise InvalidInput(f"{what} names a shared-memory region and carries contents; expected one")
        total += wanted.byte_size
        if total > budget:
            raise InvalidInput(
                f"{what}: the request's inputs in shared memory reach {total} bytes; expected at most "
                f"{budget} (the server's --shared-memory-max-request-bytes): send fewer rows per request"
            )
        data = regions.read(wanted.region, wanted.offset, wanted.byte_size, what)
        resolved.raw_input_contents.append(bytes(data))
    return resolved


def output_ranges(
    message: kpb.ModelInferRequest, regions: SystemSharedMemory | None, model: str
) -> dict[str, RegionRange]:
    """The requested outputs to write into regions, by name, each checked against its region when
    ``regions`` is given (at the request's start: refused before the model runs)."""
    ranges = {}
    for output in message.outputs:
        what = f"model {clip(model)!r}: requested output {clip(output.name, 100)!r}"
        wanted = region_range(output.parameters, what)
        if wanted is None:
            continue
        if regions is not None:
            regions.check(wanted.region, wanted.offset, wanted.byte_size, what)
        ranges[output.name] = wanted
    return ranges


@dataclass(frozen=True)
class WrittenOutput:
    """An output answered in a region: where, and how many bytes were written."""

    region: str
    offset: int
    byte_size: int


def write_outputs(
    tensors: Sequence[OutputTensor],
    ranges: Mapping[str, RegionRange],
    regions: SystemSharedMemory,
    model: str,
) -> dict[str, WrittenOutput]:
    """Write each output of ``ranges`` into its region; what was written where, by output."""
    written = {}
    for name, _datatype, _shape, raw in tensors:
        wanted = ranges.get(name)
        if wanted is None:
            continue
        data = raw.data.cast("B") if isinstance(raw, np.ndarray) else memoryview(raw)
        what = f"model {clip(model)!r}: output {clip(name, 100)!r}"
        regions.write(wanted.region, wanted.offset, wanted.byte_size, data, what)
        written[name] = WrittenOutput(wanted.region, wanted.offset, len(data))
    return written


def written_parameters(written: WrittenOutput) -> dict[str, str | int]:
    """The parameters by which a response says where an output was written, and its size (the
    offset only when not 0)."""
    offset: dict[str, str | int] = {OFFSET: written.offset} if written.offset else {}
    return {REGION: written.region, **offset, BYTE_SIZE: written.byte_size}


def add_written_parameters(output: kpb.ModelInferResponse.InferOutputTensor, written: WrittenOutput) -> None:
    """``written_parameters`` among a gRPC response's output's parameters."""
    for key, value in written_parameters(written).items():
        if isinstance(value, str):
            output.parameters[key].string_param = value
        else:
            output.parameters[key].int64_param = value
