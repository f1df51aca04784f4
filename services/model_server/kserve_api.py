"""The KServe v2 (Triton) gRPC face of a model server, on the same port as the Arrow service.

Clients of the Triton ecosystem (``tritonclient``, ``perf_analyzer``, KServe's own clients)
talk to udfserve without knowing it: ``inference.GRPCInferenceService`` as ``tritonclient``
ships it is served from the same ``grpc.aio`` server, so one address answers both protocols.
Requests go through the model's dynamic batcher, metrics and limits exactly as Arrow batches
do, so both kinds of clients are merged into the same backend calls.

Tensors (decoded by ``udfserve.kserve_codec``, the rules the Spark client also uses)
    The first dimension of every input is the batch (rows) and must agree between inputs; the
    others must equal the model's per-row shape (``-1`` free). A per-row scalar is advertised
    the way Triton writes it, ``dims: [1]`` reshaped to ``[]``, so ``[rows, 1]`` and ``[rows]``
    are both accepted and outputs come back as ``[rows, 1]``. Datatypes are coerced to the
    model's as on the Arrow path: float inputs accept integer and floating-point values (FP64
    narrowed to FP32), integer inputs accept integers that fit, BOOL only BOOL. A ``string``
    input (``tf.string``) is a BYTES tensor, raw (each element a 4-byte little-endian length
    and its bytes, as Triton encodes it) or in ``contents.bytes_contents``; BYTES for a numeric
    input, or numbers for a string input, are refused naming the input and both datatypes.
    Outputs are answered in ``raw_output_contents``.

Status codes are Triton's: INVALID_ARGUMENT for a request that does not match the model,
NOT_FOUND for an unknown model or version, UNAVAILABLE while a model loads or the server
drains, and UNAVAILABLE with Triton's "Exceeds maximum queue size" for a full queue (the Arrow
path answers RESOURCE_EXHAUSTED there), INTERNAL only for a backend fault. On a stream an error
is answered in ``error_message`` and the stream goes on, unless the client sent the
``triton_grpc_error: true`` header, which ends the stream with the status as Triton does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as kpb
from tritonclient.grpc import service_pb2_grpc as kpb_grpc

import udfserve
from services.model_server.errors import QueueFull, failure_status
from services.model_server.in_flight import InFlightRequests
from services.model_server.job_context import JobContext, parse_job_context
from services.model_server.metrics import ModelMetrics, ServerMetrics
from services.model_server.models import LoadedModel, ModelTable, ServedModel
from services.model_server.streaming import MAX_IN_FLIGHT_PER_STREAM, Pending, answer_inline
from udfserve import kserve_codec as codec
from udfserve.runtime.errors import BackendFault, InvalidInput, ServingError
from udfserve.runtime.tensor_conversion import answer_bytes_at_least, check_answer_size
from udfserve.runtime.tensor_spec import TensorSpec, numpy_dtype, zeros

logger = logging.getLogger(__name__)


SERVER_NAME = "udfserve"
EXTENSIONS = ("model_configuration", "statistics")
"""KServe extensions served beyond the core protocol (Triton's names for ModelConfig and
ModelStatistics)."""

TRITON_GRPC_ERROR_HEADER = "triton_grpc_error"
"""Header with which a Triton client asks a stream to end with the status of its first error."""

QUEUE_FULL_PREFIX = "Exceeds maximum queue size"
"""Triton's words for a full queue; clients of Triton recognise back-pressure by them."""

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

_PROTO_TYPE_OF_DTYPE = {
    dtype: mc.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")
    for dtype, name in DATATYPE_OF_DTYPE.items()
}
"""Triton's model configuration names BYTES ``TYPE_STRING``."""


@dataclass(frozen=True)
class _Failure:
    code: grpc.StatusCode
    message: str


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


DecodedTensor: TypeAlias = "tuple[str, str, tuple[int, ...], np.ndarray]"
"""An input a native front end decoded: name, datatype, shape (rows first), and the array of that
shape over the request's raw contents."""


@dataclass(frozen=True)
class TensorAnswer:
    """An answer for a native front end to encode: the response's head and its output tensors."""

    model_name: str
    model_version: str
    id: str
    tensors: list[OutputTensor]


# -- tensors -------------------------------------------------------------------------------
def _advertised_dims(spec: TensorSpec) -> list[int]:
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
class _InputPlan:
    """One input of a model as a request tensor must carry it, worked out once per model."""

    spec: TensorSpec
    datatype: str
    dtype: np.dtype
    scalar: bool


@dataclass(frozen=True)
class _Plan:
    """What reading one loaded model's requests needs, worked out once per model rather than per
    request: the request path of a small request is mostly such bookkeeping."""

    by_name: dict[str, _InputPlan]


def _plan_of(specs: tuple[TensorSpec, ...]) -> _Plan:
    by_name = {}
    for spec in specs:
        datatype = DATATYPE_OF_DTYPE[spec.dtype]
        by_name[spec.name] = _InputPlan(spec, datatype, codec.NUMPY_DTYPE_OF[datatype], not spec.shape)
    return _Plan(by_name)


def request_to_inputs(
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...], plan: _Plan | None = None
) -> tuple[dict[str, np.ndarray], int]:
    """Check the request's tensors against the model's inputs; arrays of the declared dtype, and rows.

    The common request (raw contents of the model's own datatypes, every input once) is read
    without building any message; anything else takes the checks that explain what is wrong.
    """
    if plan is None:
        plan = _plan_of(specs)
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
    tensors: Sequence[DecodedTensor], plan: _Plan
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
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...], plan: _Plan
) -> tuple[dict[str, np.ndarray], int]:
    prefix = f"model {model!r}: "
    expected = [spec.name for spec in specs]
    received = [tensor.name for tensor in request.inputs]
    if sorted(received) != sorted(expected) or len(set(received)) != len(received):
        raise InvalidInput(f"{prefix}expected exactly the inputs {expected}, received {received}")
    raw = request.raw_input_contents
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
                f"{what}: expected shape {[-1, *_advertised_dims(spec)]} (rows, then the per-row shape; "
                f"-1 is free), received shape {list(shape)}"
            )
        if raw and tensor.HasField("contents"):
            raise InvalidInput(
                f"{what}: carries typed contents while the request uses raw_input_contents; expected one or "
                "the other for the whole request"
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


def _outputs_named(names: Sequence[str], specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...] | None:
    """The outputs requested by name only (all of them for none); None if one is not an output."""
    if not names:
        return specs
    by_name = {spec.name: spec for spec in specs}
    chosen = [by_name.get(name) for name in names]
    return None if None in chosen else tuple(spec for spec in chosen if spec is not None)


def _requested_outputs(
    request: kpb.ModelInferRequest, model: str, specs: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    if not request.outputs:
        return specs
    by_name = {spec.name: spec for spec in specs}
    chosen = []
    for output in request.outputs:
        what = f"model {model!r}: requested output {output.name!r}"
        if output.name not in by_name:
            raise InvalidInput(f"{what} is not an output of the model; expected one of {list(by_name)}")
        if any(key.startswith("shared_memory") or key == "classification" for key in output.parameters):
            raise InvalidInput(
                f"{what}: parameters {sorted(output.parameters)} ask for shared memory or classification, "
                "which udfserve does not serve; expected plain tensors"
            )
        chosen.append(by_name[output.name])
    return tuple(chosen)


def _empty_outputs(specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    return {spec.name: zeros(spec, 0) for spec in specs}


def _parse_version(version: str, model: str) -> int:
    if not version:
        return 0
    if not (version.isascii() and version.isdigit()):
        raise InvalidInput(
            f"model {model!r}: version {version!r} is not a version number; expected digits, or empty for "
            "the served version"
        )
    return int(version)


# -- metadata ------------------------------------------------------------------------------
def model_metadata(served: ServedModel) -> kpb.ModelMetadataResponse:
    assert served.model is not None and served.source is not None
    model = served.model

    def tensors(specs: tuple[TensorSpec, ...]) -> list[kpb.ModelMetadataResponse.TensorMetadata]:
        return [
            kpb.ModelMetadataResponse.TensorMetadata(
                name=s.name, datatype=DATATYPE_OF_DTYPE[s.dtype], shape=[-1, *_advertised_dims(s)]
            )
            for s in specs
        ]

    return kpb.ModelMetadataResponse(
        name=served.name,
        versions=[str(served.source.version)],
        platform=model.platform,
        inputs=tensors(model.inputs),
        outputs=tensors(model.outputs),
    )


def model_config(served: ServedModel) -> mc.ModelConfig:
    """The model as a Triton ``config.pbtxt`` would describe it: what perf_analyzer reads."""
    assert served.model is not None and served.source is not None
    model, config = served.model, served.source.config

    def reshape(spec: TensorSpec) -> mc.ModelTensorReshape | None:
        return None if spec.shape else mc.ModelTensorReshape(shape=[])

    batching = config.dynamic_batching
    return mc.ModelConfig(
        name=served.name,
        platform=model.platform,
        backend=model.platform,
        version_policy=mc.ModelVersionPolicy(
            specific=mc.ModelVersionPolicy.Specific(versions=[served.source.version])
        ),
        max_batch_size=config.max_batch_size,
        input=[
            mc.ModelInput(
                name=s.name,
                data_type=_PROTO_TYPE_OF_DTYPE[s.dtype],
                dims=_advertised_dims(s),
                reshape=reshape(s),
            )
            for s in model.inputs
        ],
        output=[
            mc.ModelOutput(
                name=s.name,
                data_type=_PROTO_TYPE_OF_DTYPE[s.dtype],
                dims=_advertised_dims(s),
                reshape=reshape(s),
            )
            for s in model.outputs
        ],
        dynamic_batching=(
            mc.ModelDynamicBatching(max_queue_delay_microseconds=round(batching.max_queue_delay_s * 1e6))
            if batching.enabled
            else None
        ),
    )


# -- the service ---------------------------------------------------------------------------
class KServeServicer(kpb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over the models of this process.

    RPCs not overridden here (repository control, shared memory, trace and log settings) answer
    UNIMPLEMENTED, as the generated base class does.
    """

    def __init__(
        self,
        models: ModelTable,
        metrics: ServerMetrics,
        max_message_bytes: int,
        in_flight: InFlightRequests | None = None,
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._max_response_bytes = max_message_bytes - 1024  # room for the protobuf envelope
        self._in_flight = in_flight or InFlightRequests()
        self._plans: weakref.WeakKeyDictionary[LoadedModel, _Plan] = weakref.WeakKeyDictionary()

    # -- health and metadata ---------------------------------------------------------------
    async def ServerLive(self, request: kpb.ServerLiveRequest, context: grpc.aio.ServicerContext):
        return kpb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: kpb.ServerReadyRequest, context: grpc.aio.ServicerContext):
        """Ready once loading is over, some model serves, and the server is not draining: the
        same rule as the overall gRPC health status."""
        models = self._models
        ready = (
            models.loading_done.is_set()
            and not models.draining
            and any(m.state == "ready" for m in models.all())
        )
        return kpb.ServerReadyResponse(ready=ready)

    async def ModelReady(self, request: kpb.ModelReadyRequest, context: grpc.aio.ServicerContext):
        """False for a model that is unknown, loading, failed or draining, as Triton answers."""
        try:
            version = _parse_version(request.version, request.name)
        except InvalidInput as exc:
            await context.abort(exc.code, exc.message)
        try:
            self._models.ready(request.name, version)
        except ServingError:
            return kpb.ModelReadyResponse(ready=False)
        return kpb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: kpb.ServerMetadataRequest, context: grpc.aio.ServicerContext):
        return kpb.ServerMetadataResponse(
            name=SERVER_NAME, version=udfserve.__version__, extensions=list(EXTENSIONS)
        )

    async def ModelMetadata(self, request: kpb.ModelMetadataRequest, context: grpc.aio.ServicerContext):
        try:
            served = self._models.ready(request.name, _parse_version(request.version, request.name))
        except ServingError as exc:
            await context.abort(exc.code, exc.message)
        return model_metadata(served)

    async def ModelConfig(self, request: kpb.ModelConfigRequest, context: grpc.aio.ServicerContext):
        try:
            served = self._models.ready(request.name, _parse_version(request.version, request.name))
        except ServingError as exc:
            await context.abort(exc.code, exc.message)
        return kpb.ModelConfigResponse(config=model_config(served))

    async def ModelStatistics(
        self, request: kpb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> kpb.ModelStatisticsResponse:
        """The named model's statistics, or every ready model's for an empty name (as Triton), also
        while the server drains (perf_analyzer reads them after its last request); requests of both
        protocols count (see ``statistics``)."""
        try:
            if request.name:
                version = _parse_version(request.version, request.name)
                chosen = [self._models.ready(request.name, version, while_draining=True)]
            elif request.version:
                raise InvalidInput(
                    f"version {request.version!r} without a model name; expected a name with the version, "
                    "or neither for every model"
                )
            else:
                chosen = [served for served in self._models.all() if served.state == "ready"]
        except ServingError as exc:
            await context.abort(exc.code, exc.message)
        return kpb.ModelStatisticsResponse(
            model_stats=[
                served.metrics.statistics.to_proto(served.name, served.source.version)
                for served in sorted(chosen, key=lambda served: served.name)
                if served.metrics is not None and served.source is not None
            ]
        )

    # -- inference -------------------------------------------------------------------------
    async def ModelInfer(
        self, request: kpb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kpb.ModelInferResponse:
        """Checked and queued inline, then one await on the batcher's future: no task or
        coroutine per request beyond the handler itself."""
        outcome = self._start(request, parse_job_context(context.invocation_metadata()))
        if isinstance(outcome, Pending):
            future, finish = outcome
            try:
                await future
            except asyncio.CancelledError:  # the client went away: release what the request holds
                future.cancel()
                finish(future)
                raise
            except Exception:
                pass  # the batcher's failure, answered by finish
            answer = finish(future)
        else:
            answer = outcome
        if isinstance(answer, _Failure):
            await context.abort(answer.code, answer.message)
        return answer

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[kpb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kpb.ModelStreamInferResponse]:
        """Requests of one stream run concurrently (up to ``MAX_IN_FLIGHT_PER_STREAM``) and are
        answered as they complete; the response's ``id`` names the request."""
        invocation = context.invocation_metadata()
        metadata = dict(invocation or ())
        end_on_error = str(metadata.get(TRITON_GRPC_ERROR_HEADER, "")).lower() == "true"
        job = parse_job_context(invocation)

        def start(request: kpb.ModelInferRequest) -> _StreamAnswer | Pending[_StreamAnswer]:
            outcome = self._start(request, job)
            if isinstance(outcome, Pending):
                return Pending(outcome.future, functools.partial(_with_request, request, outcome.finish))
            return request, outcome

        answers: AsyncIterator[_StreamAnswer] = answer_inline(
            request_iterator, start, MAX_IN_FLIGHT_PER_STREAM
        )
        async for request, result in answers:
            if isinstance(result, _Failure):
                if end_on_error:
                    await context.abort(result.code, result.message)
                yield kpb.ModelStreamInferResponse(
                    error_message=result.message,
                    infer_response=kpb.ModelInferResponse(
                        model_name=request.model_name, model_version=request.model_version, id=request.id
                    ),
                )
            else:
                yield kpb.ModelStreamInferResponse(infer_response=result)

    def _start(self, request: kpb.ModelInferRequest, job: JobContext) -> _Answer | Pending[_Answer]:
        """Check, decode and queue one request; the answer, or the batcher's future and what makes
        the answer from it. Never raises: failures are answered with their status. ``job`` is the
        Spark job the request came from, when its metadata says (as the Arrow protocol's)."""
        started_s = time.perf_counter()
        model_metrics = self._models.metrics_of(request.model_name)
        try:
            served = self._models.ready(
                request.model_name, _parse_version(request.model_version, request.model_name)
            )
            model = served.model
            assert model is not None and served.metrics is not None
            output_specs = _requested_outputs(request, served.name, model.outputs)
            inputs, rows = request_to_inputs(request, served.name, model.inputs, self._plan(model))
        except Exception as exc:
            return self._refuse(model_metrics, job, request, exc, started_s)
        return self._queue(served, job, request, output_specs, inputs, rows, started_s, _as_message)

    def start_decoded(
        self,
        head: RequestHead,
        tensors: Sequence[DecodedTensor],
        output_names: Sequence[str],
        job: JobContext,
    ) -> _Answer | TensorAnswer | Pending[_Answer | TensorAnswer] | None:
        """``_start`` for a request a native front end decoded already (raw contents of fixed-size
        datatypes, no parameters): answered as tensors, not as a message. None when the request is
        not the common one (another datatype than the model's, a wrong shape, an unknown output):
        the caller then takes ``_start`` with the message, whose checks explain what is wrong."""
        started_s = time.perf_counter()
        model_metrics = self._models.metrics_of(head.model_name)
        try:
            served = self._models.ready(head.model_name, _parse_version(head.model_version, head.model_name))
            model = served.model
            assert model is not None and served.metrics is not None
            decoded = decoded_to_inputs(tensors, self._plan(model))
        except Exception as exc:
            return self._refuse(model_metrics, job, head, exc, started_s)
        output_specs = _outputs_named(output_names, model.outputs)
        if decoded is None or output_specs is None:
            return None
        inputs, rows = decoded
        return self._queue(served, job, head, output_specs, inputs, rows, started_s, _as_tensors)

    def _queue(
        self,
        served: ServedModel,
        job: JobContext,
        request: RequestHead,
        output_specs: tuple[TensorSpec, ...],
        inputs: dict[str, np.ndarray],
        rows: int,
        started_s: float,
        deliver: _Deliver[_A],
    ) -> _A | _Failure | Pending[_A | _Failure]:
        """Queue checked inputs on the model's batcher (or answer an empty request at once)."""
        model_metrics = served.metrics
        assert model_metrics is not None and served.batcher is not None and served.model is not None
        try:
            at_least = answer_bytes_at_least(output_specs, rows)
            check_answer_size(served.name, rows, at_least, self._max_response_bytes, before_running=True)
            if rows == 0:
                response = deliver(
                    self._answer(served, request, output_specs, _empty_outputs(served.model.outputs), 0)
                )
                self._observe(model_metrics, job, request, "OK", started_s, 0)
                return response
            future = served.batcher.enqueue(inputs)
        except Exception as exc:
            return self._refuse(model_metrics, job, request, exc, started_s)
        self._in_flight.begin()
        model_metrics.in_flight.inc()
        finish = functools.partial(
            self._finish, served, model_metrics, job, request, output_specs, rows, started_s, deliver
        )
        return Pending(future, finish)

    def _finish(
        self,
        served: ServedModel,
        model_metrics: ModelMetrics,
        job: JobContext,
        request: RequestHead,
        output_specs: tuple[TensorSpec, ...],
        rows: int,
        started_s: float,
        deliver: _Deliver[_A],
        outputs: asyncio.Future[dict[str, np.ndarray]],
    ) -> _A | _Failure:
        """The answer to one request once the batcher answered it (or its client went away first,
        and the answer is not wanted)."""
        self._in_flight.end()
        model_metrics.in_flight.dec()
        if outputs.cancelled():
            raise asyncio.CancelledError
        try:
            response = deliver(self._answer(served, request, output_specs, outputs.result(), rows))
        except Exception as exc:
            return self._refuse(model_metrics, job, request, exc, started_s)
        self._observe(model_metrics, job, request, "OK", started_s, rows)
        return response

    def _answer(
        self,
        served: ServedModel,
        request: RequestHead,
        output_specs: tuple[TensorSpec, ...],
        outputs: dict[str, np.ndarray],
        rows: int,
    ) -> TensorAnswer:
        """One request's answer as tensors, checked against the message limit; both front ends
        send it, the python one as a message (``_as_message``)."""
        assert served.source is not None
        tensors, size_bytes = outputs_to_tensors(outputs, output_specs, rows)
        check_answer_size(served.name, rows, size_bytes, self._max_response_bytes)
        return TensorAnswer(served.name, str(served.source.version), request.id, tensors)

    def _refuse(
        self,
        model_metrics: ModelMetrics | None,
        job: JobContext,
        request: RequestHead,
        exc: Exception,
        started_s: float,
    ) -> _Failure:
        """The failure answering one request: Triton's words for a full queue, a ``ServingError``
        with its status, anything else INTERNAL."""
        if isinstance(exc, QueueFull):
            code, message = grpc.StatusCode.UNAVAILABLE, f"{QUEUE_FULL_PREFIX}: {exc.message}"
        else:
            code, message = failure_status(exc, f"model {request.model_name!r} request {request.id!r}")
        self._observe(model_metrics, job, request, code.name, started_s, 0)
        return _Failure(code, message)

    def _observe(
        self,
        model_metrics: ModelMetrics | None,
        job: JobContext,
        request: RequestHead,
        code: str,
        started_s: float,
        rows: int,
    ) -> None:
        seconds = time.perf_counter() - started_s
        self._metrics.observe_answer(model_metrics, job, request.id, code, seconds, rows)

    def _plan(self, model: LoadedModel) -> _Plan:
        plan = self._plans.get(model)
        if plan is None:
            plan = self._plans[model] = _plan_of(model.inputs)
        return plan


_Answer: TypeAlias = "kpb.ModelInferResponse | _Failure"
_A = TypeVar("_A", kpb.ModelInferResponse, TensorAnswer)
_Deliver: TypeAlias = Callable[[TensorAnswer], _A]
"""How a front end sends an answer: as a message (the python one), as tensors (the native one)."""


def _as_message(answer: TensorAnswer) -> kpb.ModelInferResponse:
    response = kpb.ModelInferResponse(
        model_name=answer.model_name, model_version=answer.model_version, id=answer.id
    )
    for name, datatype, shape, raw in answer.tensors:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw.tobytes() if isinstance(raw, np.ndarray) else raw)
    return response


def _as_tensors(answer: TensorAnswer) -> TensorAnswer:
    return answer


_StreamAnswer: TypeAlias = "tuple[kpb.ModelInferRequest, _Answer]"


def _with_request(
    request: kpb.ModelInferRequest,
    finish: Callable[[asyncio.Future[dict[str, np.ndarray]]], _Answer],
    future: asyncio.Future[dict[str, np.ndarray]],
) -> _StreamAnswer:
    return request, finish(future)


def add_kserve_service(
    server: grpc.aio.Server,
    models: ModelTable,
    metrics: ServerMetrics,
    max_message_bytes: int,
    in_flight: InFlightRequests | None = None,
) -> KServeServicer:
    """Serve the KServe v2 protocol from ``server``, beside the Arrow service."""
    servicer = KServeServicer(models, metrics, max_message_bytes, in_flight)
    kpb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    return servicer
