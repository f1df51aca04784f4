"""How the KServe v2 front ends answer a request: the model's outputs as tensors, sent as a
``ModelInferResponse`` (the python front end), as the tensors themselves (the native one, which
encodes them without the GIL), or inside a ``ModelStreamInferResponse``; a refusal as the status
the call ends with, or as the stream's ``error_message``.

Status codes are Triton's: those of ``errors.failure_status``, except a full queue, which is
UNAVAILABLE with Triton's "Exceeds maximum queue size" (the Arrow path answers RESOURCE_EXHAUSTED
there): clients of Triton recognise back-pressure by these words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

import grpc
import numpy as np

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.services.model_server.core.request_lifecycle import FrontEnd, InferenceRequest
from udfserve.services.model_server.errors import QueueFull, failure_status
from udfserve.services.model_server.frontends.kserve.shared_memory_tensors import (
    WrittenOutput,
    add_written_parameters,
    output_ranges,
    write_outputs,
)
from udfserve.services.model_server.frontends.kserve.system_shared_memory import SystemSharedMemory
from udfserve.services.model_server.frontends.kserve.tensors import OutputTensor, outputs_to_tensors

QUEUE_FULL_PREFIX = "Exceeds maximum queue size"
"""Triton's words for a full queue; clients of Triton recognise back-pressure by them."""


class RequestHead(Protocol):
    """What answering and counting a request read of it: a ``ModelInferRequest`` is one."""

    @property
    def id(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def model_version(self) -> str: ...


@dataclass(frozen=True)
class DecodedHead:
    """The ``RequestHead`` of a request a native front end decoded."""

    id: str
    model_name: str
    model_version: str


@dataclass(frozen=True)
class Failure:
    """A refused request: the status its call ends with (a stream's, when the client asked
    streams to end on an error)."""

    code: grpc.StatusCode
    message: str


@dataclass(frozen=True)
class TensorAnswer:
    """An answer for a native front end to encode: the response's head and its output tensors."""

    model_name: str
    model_version: str
    id: str
    tensors: list[OutputTensor]
    shared: Mapping[str, WrittenOutput] = field(default_factory=dict)
    """The outputs written into system shared memory (their tensors' contents are not sent)."""


MessageAnswer: TypeAlias = "kpb.ModelInferResponse | Failure"
"""A ``ModelInfer`` answer of the python front end."""
NativeAnswer: TypeAlias = "TensorAnswer | Failure"
"""A ``ModelInfer`` answer of the native front end, for a request it decoded."""
StreamAnswer: TypeAlias = "kpb.ModelStreamInferResponse | Failure"
"""A ``ModelStreamInfer`` answer; a ``Failure`` ends the stream."""


def _tensors(
    request: InferenceRequest, outputs: dict[str, np.ndarray], regions: SystemSharedMemory | None = None
) -> TensorAnswer:
    """One request's answer as tensors, checked against the message limit; every front end sends
    this, the python one as a message (``_as_message``). Outputs the request asked for in system
    shared memory are written into their regions (``regions``) and only counted here."""
    served = request.served
    assert served.source is not None
    tensors, size_bytes = outputs_to_tensors(outputs, request.outputs, request.rows)
    message = request.message
    ranges = {}
    if regions is not None and isinstance(message, kpb.ModelInferRequest) and message.outputs:
        ranges = output_ranges(message, None, served.name)
        size_bytes -= sum(_size(raw) for name, _, _, raw in tensors if name in ranges)
    request.check_answer_size(size_bytes)
    written: dict[str, WrittenOutput] = {}
    if ranges:
        assert regions is not None
        written = write_outputs(tensors, ranges, regions, served.name)
    return TensorAnswer(served.name, str(served.source.version), message.id, tensors, written)


def _size(raw: np.ndarray | bytes) -> int:
    return raw.nbytes if isinstance(raw, np.ndarray) else len(raw)


def _as_message(answer: TensorAnswer) -> kpb.ModelInferResponse:
    response = kpb.ModelInferResponse(
        model_name=answer.model_name, model_version=answer.model_version, id=answer.id
    )
    for name, datatype, shape, raw in answer.tensors:
        output = response.outputs.add(name=name, datatype=datatype, shape=shape)
        written = answer.shared.get(name)
        if written is not None:
            add_written_parameters(output, written)
            # An empty entry, even where every output went to shared memory, as Triton answers:
            # its C++ client (perf_analyzer) reads raw_output_contents[i] for every output i.
            response.raw_output_contents.append(b"")
            continue
        response.raw_output_contents.append(raw.tobytes() if isinstance(raw, np.ndarray) else raw)
    return response


def _failure(head: RequestHead, exc: Exception) -> Failure:
    """The failure refusing one request: Triton's words for a full queue, a ``ServingError`` with
    its status, anything else INTERNAL."""
    if isinstance(exc, QueueFull):
        return Failure(grpc.StatusCode.UNAVAILABLE, f"{QUEUE_FULL_PREFIX}: {exc.message}")
    return Failure(*failure_status(exc, f"model '{clip(head.model_name)}' request '{clip(head.id)}'"))


class MessageAnswers(FrontEnd[RequestHead, MessageAnswer]):
    """``ModelInfer`` answered with a message: the python front end's calls, and the native front
    end's requests it did not decode. ``regions``: where outputs asked for in system shared memory
    are written (None where it is not served)."""

    def __init__(self, regions: SystemSharedMemory | None = None) -> None:
        self.regions = regions

    def answer(
        self, request: InferenceRequest[RequestHead, MessageAnswer], outputs: dict[str, np.ndarray]
    ) -> MessageAnswer:
        return _as_message(_tensors(request, outputs, self.regions))

    def refusal(
        self, request: InferenceRequest[RequestHead, MessageAnswer], exc: Exception
    ) -> tuple[grpc.StatusCode, MessageAnswer]:
        failure = _failure(request.message, exc)
        return failure.code, failure


class TensorAnswers(FrontEnd[RequestHead, NativeAnswer]):
    """``ModelInfer`` answered with its tensors, for the native front end to encode (and the HTTP
    one, whose ``regions`` are those of system shared memory)."""

    def __init__(self, regions: SystemSharedMemory | None = None) -> None:
        self.regions = regions

    def answer(
        self, request: InferenceRequest[RequestHead, NativeAnswer], outputs: dict[str, np.ndarray]
    ) -> NativeAnswer:
        return _tensors(request, outputs, self.regions)

    def refusal(
        self, request: InferenceRequest[RequestHead, NativeAnswer], exc: Exception
    ) -> tuple[grpc.StatusCode, NativeAnswer]:
        failure = _failure(request.message, exc)
        return failure.code, failure


class StreamAnswers(FrontEnd[RequestHead, StreamAnswer]):
    """The answers of one ``ModelStreamInfer`` stream: a refusal is the response's
    ``error_message`` and the stream goes on, unless ``end_on_error`` (the client's
    ``triton_grpc_error`` header): then it is the ``Failure`` that ends the stream."""

    def __init__(self, end_on_error: bool, regions: SystemSharedMemory | None = None) -> None:
        self._end_on_error = end_on_error
        self._regions = regions

    def answer(
        self, request: InferenceRequest[RequestHead, StreamAnswer], outputs: dict[str, np.ndarray]
    ) -> StreamAnswer:
        answer = _tensors(request, outputs, self._regions)
        return kpb.ModelStreamInferResponse(infer_response=_as_message(answer))

    def refusal(
        self, request: InferenceRequest[RequestHead, StreamAnswer], exc: Exception
    ) -> tuple[grpc.StatusCode, StreamAnswer]:
        head = request.message
        failure = _failure(head, exc)
        if self._end_on_error:
            return failure.code, failure
        response = kpb.ModelStreamInferResponse(
            error_message=failure.message,
            infer_response=kpb.ModelInferResponse(
                model_name=head.model_name, model_version=head.model_version, id=head.id
            ),
        )
        return failure.code, response
