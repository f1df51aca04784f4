"""The KServe v2 (Triton) gRPC face of a model server, on the same port as the Arrow service.

Clients of the Triton ecosystem (``tritonclient``, ``perf_analyzer``, KServe's own clients)
talk to udfserve without knowing it: ``inference.GRPCInferenceService`` (NVIDIA's
``grpc_service.proto``, the file ``tritonclient`` ships, generated into ``udfserve.protocol.kserve``)
is served from the same ``grpc.aio`` server, so one address answers both protocols.
Requests go through the model's dynamic batcher, metrics and limits exactly as Arrow batches
do (``request_lifecycle``), so both kinds of clients are merged into the same backend calls.

This module reads the calls; the tensors are decoded and encoded by ``kserve_tensors``, the
answers made by ``kserve_answers``, what the server tells about its models by
``kserve_metadata``, the model repository calls by ``kserve.repository``.

Status codes are Triton's: INVALID_ARGUMENT for a request that does not match the model,
NOT_FOUND for an unknown model or version, UNAVAILABLE while a model loads or the server
drains, and UNAVAILABLE with Triton's "Exceeds maximum queue size" for a full queue (the Arrow
path answers RESOURCE_EXHAUSTED there), INTERNAL only for a backend fault. A request finding its
application's share of a model's queue full first waits for room, as an Arrow stream's does
(``batching.admission``): a stream's request with the stream read no further, a unary call's
while fewer than ``--room-wait-calls`` calls wait (``core.call_room_waits``). On a stream an error
is answered in ``error_message`` and the stream goes on, unless the client sent the
``triton_grpc_error: true`` header, which ends the stream with the status as Triton does.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import NoReturn, TypeVar

import grpc

import udfserve
from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.protocol.kserve import grpc_service_pb2_grpc as kpb_grpc
from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.services.model_server.core.job_context import JobContext, parse_job_context
from udfserve.services.model_server.core.model_control import ModelControl
from udfserve.services.model_server.core.model_table import LoadedModel
from udfserve.services.model_server.core.pending import Pending
from udfserve.services.model_server.core.request_lifecycle import FrontEnd, InferenceRequest, RequestLifecycle
from udfserve.services.model_server.errors import failure_status
from udfserve.services.model_server.frontends.kserve import repository, shared_memory_calls
from udfserve.services.model_server.frontends.kserve.answers import (
    Failure,
    MessageAnswer,
    MessageAnswers,
    NativeAnswer,
    RequestHead,
    StreamAnswer,
    StreamAnswers,
    TensorAnswers,
)
from udfserve.services.model_server.frontends.kserve.metadata import (
    EXTENSIONS,
    SERVER_NAME,
    model_config,
    model_metadata,
    model_statistics,
)
from udfserve.services.model_server.frontends.kserve.shared_memory_calls import (
    SharedMemoryCalls,
    SharedMemoryNotServed,
)
from udfserve.services.model_server.frontends.kserve.shared_memory_tensors import (
    output_ranges,
    read_inputs,
    uses_shared_memory,
)
from udfserve.services.model_server.frontends.kserve.system_shared_memory import SystemSharedMemory
from udfserve.services.model_server.frontends.kserve.tensors import (
    DecodedTensor,
    InputPlan,
    decoded_to_inputs,
    outputs_named,
    parse_version,
    plan_of,
    request_to_inputs,
    requested_outputs,
)
from udfserve.services.model_server.frontends.model_control_api import ControlCalls
from udfserve.services.model_server.frontends.readable_requests import add_service
from udfserve.services.model_server.frontends.streaming import (
    STREAM_METHODS,
    StreamBounds,
    UnparseableRequest,
    answer_inline,
    parsed_requests,
    size_as_read,
)

logger = logging.getLogger(__name__)

_A = TypeVar("_A")

TRITON_GRPC_ERROR_HEADER = "triton_grpc_error"
"""Header with which a Triton client asks a stream to end with the status of its first error."""


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """``context.abort``, which raises, said so for the type checker: the handlers return typed
    messages, and grpc ships no types."""
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # it raises


class KServeServicer(SharedMemoryCalls, kpb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over the models of this process.

    RPCs not overridden here (trace and log settings) answer UNIMPLEMENTED, as the generated base
    class does. The shared-memory calls are ``SharedMemoryCalls``': system shared memory served when
    ``shared_memory`` is given, CUDA shared memory refused with UNIMPLEMENTED and its reason.
    """

    def __init__(
        self,
        lifecycle: RequestLifecycle,
        stream_bounds: StreamBounds,
        control: ModelControl,
        extensions: Sequence[str] = EXTENSIONS,
        shared_memory: SystemSharedMemory | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self.shared_memory = shared_memory
        self._extensions = list(extensions)
        self._control = ControlCalls(control, lifecycle.models)
        self._stream_bounds = stream_bounds
        self._models = lifecycle.models
        self._plans: weakref.WeakKeyDictionary[LoadedModel, InputPlan] = weakref.WeakKeyDictionary()
        self._messages = MessageAnswers(shared_memory)
        self._tensors = TensorAnswers()

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
            version = parse_version(request.version, request.name)
        except InvalidInput as exc:
            await _abort(context, exc.code, exc.message)
        try:
            self._models.ready(request.name, version)
        except ServingError:
            return kpb.ModelReadyResponse(ready=False)
        return kpb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: kpb.ServerMetadataRequest, context: grpc.aio.ServicerContext):
        return kpb.ServerMetadataResponse(
            name=SERVER_NAME, version=udfserve.__version__, extensions=self._extensions
        )

    async def ModelMetadata(self, request: kpb.ModelMetadataRequest, context: grpc.aio.ServicerContext):
        try:
            served = self._models.ready(request.name, parse_version(request.version, request.name))
        except ServingError as exc:
            await _abort(context, exc.code, exc.message)
        return model_metadata(
            served, [version.version for version in self._models.served_versions(served.name)]
        )

    async def ModelConfig(self, request: kpb.ModelConfigRequest, context: grpc.aio.ServicerContext):
        try:
            served = self._models.ready(request.name, parse_version(request.version, request.name))
        except ServingError as exc:
            await _abort(context, exc.code, exc.message)
        return kpb.ModelConfigResponse(config=model_config(served))

    async def ModelStatistics(
        self, request: kpb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> kpb.ModelStatisticsResponse:
        """The named model's statistics, or every ready model's for an empty name (as Triton), also
        while the server drains (perf_analyzer reads them after its last request); requests of both
        protocols count (see ``statistics``)."""
        try:
            return model_statistics(self._models, request.name, request.version)
        except ServingError as exc:
            await _abort(context, exc.code, exc.message)

    # -- model repository (--model-control explicit) ------------------------------------------
    async def RepositoryIndex(
        self, request: kpb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> kpb.RepositoryIndexResponse:
        try:
            return repository.index(self._control, request)
        except ServingError as exc:
            await _abort(context, exc.code, exc.message)

    async def RepositoryModelLoad(
        self, request: kpb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> kpb.RepositoryModelLoadResponse:
        """Returns once the versions serve (``repository`` says what differs from Triton)."""
        try:
            await self._control.load(request.model_name, repository.load_config(request))
        except Exception as exc:
            code, text = failure_status(exc, f"the load of model '{clip(request.model_name)}'")
            await _abort(context, code, text)
        return kpb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: kpb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> kpb.RepositoryModelUnloadResponse:
        try:
            repository.check_unload(request)
            await self._control.unload(request.model_name)
        except Exception as exc:
            code, text = failure_status(exc, f"the unload of model '{clip(request.model_name)}'")
            await _abort(context, code, text)
        return kpb.RepositoryModelUnloadResponse()

    # -- inference -------------------------------------------------------------------------
    async def ModelInfer(
        self, request: kpb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> kpb.ModelInferResponse:
        """Checked and queued inline, then one await on the batcher's future: no task or
        coroutine per request beyond the handler itself. Its message was read within the
        server's ``UnaryBudget`` (``unary_budget.UnaryAdmission``)."""
        outcome = self.start(request, parse_job_context(context.invocation_metadata()))
        if isinstance(outcome, Pending):
            future, finish = outcome.future, outcome.finish
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
        if isinstance(answer, Failure):
            await _abort(context, answer.code, answer.message)
        return answer

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kpb.ModelStreamInferResponse]:
        """Requests of one stream run concurrently and are answered as they complete (the
        stream read while it holds less than its ``StreamBounds``); the response's ``id`` names
        the request. The requests come as the bytes gRPC read (``streaming.RawStreamRequests``)."""
        invocation = context.invocation_metadata()
        metadata = dict(invocation or ())
        stream = StreamAnswers(
            str(metadata.get(TRITON_GRPC_ERROR_HEADER, "")).lower() == "true", self.shared_memory
        )
        job = parse_job_context(invocation)

        def start(item: tuple[kpb.ModelInferRequest, int]) -> StreamAnswer | Pending[StreamAnswer]:
            return self._start(item[0], job, stream, unary_call=False)

        unreadable: list[UnparseableRequest] = []
        answers: AsyncIterator[StreamAnswer] = answer_inline(
            parsed_requests(request_iterator, kpb.ModelInferRequest, unreadable),
            start,
            self._stream_bounds,
            size_as_read,
            self._lifecycle.metrics.streams_paused,
        )
        async for answer in answers:
            if isinstance(answer, Failure):
                await _abort(context, answer.code, answer.message)
            yield answer
        if unreadable:
            await _abort(context, unreadable[0].code, unreadable[0].message)

    def start(
        self, request: kpb.ModelInferRequest, job: JobContext
    ) -> MessageAnswer | Pending[MessageAnswer]:
        """Check, decode and queue one ``ModelInfer`` (of either front end); the answer, or the
        batcher's future and what makes the answer from it. Never raises: failures are answered with
        their status. ``job`` is the Spark job the request came from, when its metadata says (as the
        Arrow protocol's)."""
        return self._start(request, job, self._messages, unary_call=True)

    def start_decoded(
        self,
        head: RequestHead,
        tensors: Sequence[DecodedTensor],
        output_names: Sequence[str],
        job: JobContext,
        front_end: FrontEnd[RequestHead, NativeAnswer] | None = None,
    ) -> NativeAnswer | Pending[NativeAnswer] | None:
        """``start`` for a request a native front end decoded already (raw contents of fixed-size
        datatypes, no parameters): answered as tensors, not as a message. None when the request is
        not the common one (another datatype than the model's, a wrong shape, an unknown output):
        the caller then takes ``start`` with the message, whose checks explain what is wrong.
        ``front_end``: who answers it, when not the native front end (the HTTP one)."""
        request = InferenceRequest(
            self._lifecycle, front_end or self._tensors, head, head.model_name, head.id, job
        )
        try:
            model = request.admit(parse_version(head.model_version, head.model_name)).model
            assert model is not None
            decoded = decoded_to_inputs(tensors, self._plan(model))
        except Exception as exc:
            return request.refuse(exc)
        output_specs = outputs_named(output_names, model.outputs)
        if decoded is None or output_specs is None:
            return None
        request.outputs = output_specs
        inputs, rows = decoded
        return request.enqueue(inputs, rows, wait_for_room=True, unary_call=True)

    def start_answered_by(
        self, request: kpb.ModelInferRequest, job: JobContext, front_end: FrontEnd[RequestHead, _A]
    ) -> _A | Pending[_A]:
        """``start``, answered through ``front_end``: for a front end of another transport, which
        makes its own answers from the tensors (KServe over HTTP)."""
        return self._start(request, job, front_end, unary_call=True)

    def refuse(
        self, head: RequestHead, job: JobContext, exc: Exception, front_end: FrontEnd[RequestHead, _A]
    ) -> _A:
        """A request refused before it could be read as a ``ModelInfer`` (an HTTP body that is not
        the protocol's), counted and answered as one refused here."""
        return InferenceRequest(self._lifecycle, front_end, head, head.model_name, head.id, job).refuse(exc)

    def _start(
        self,
        message: kpb.ModelInferRequest,
        job: JobContext,
        front_end: FrontEnd[RequestHead, _A],
        *,
        unary_call: bool,
    ) -> _A | Pending[_A]:
        """``start``, answering through ``front_end``: a ``ModelInfer`` call's, or a stream's.
        Inputs in system shared memory are read here, outputs' regions checked (and written by the
        answer, ``answers``). A request finding its share of the queue full waits for room
        (``RequestLifecycle.room_wait_s``): a stream's with its reader, a unary call's
        (``unary_call``) while the server's bound on waiting calls has a place."""
        request = InferenceRequest(self._lifecycle, front_end, message, message.model_name, message.id, job)
        try:
            served = request.admit(parse_version(message.model_version, message.model_name))
            model = served.model
            assert model is not None
            if uses_shared_memory(message):
                regions = self.shared_memory
                if regions is None:
                    raise SharedMemoryNotServed(shared_memory_calls.SYSTEM_SHARED_MEMORY_OFF)
                output_ranges(message, regions, served.name)
                message = read_inputs(message, regions, served.name)
            request.outputs = requested_outputs(message, served.name, model.outputs)
            inputs, rows = request_to_inputs(message, served.name, model.inputs, self._plan(model))
        except Exception as exc:
            return request.refuse(exc)
        return request.enqueue(inputs, rows, wait_for_room=True, unary_call=unary_call)

    def _plan(self, model: LoadedModel) -> InputPlan:
        plan = self._plans.get(model)
        if plan is None:
            plan = self._plans[model] = plan_of(model.inputs)
        return plan


def add_kserve_service(
    server: grpc.aio.Server,
    lifecycle: RequestLifecycle,
    stream_bounds: StreamBounds,
    control: ModelControl,
    extensions: Sequence[str] = EXTENSIONS,
    shared_memory: SystemSharedMemory | None = None,
) -> KServeServicer:
    """Serve the KServe v2 protocol from ``server``, beside the Arrow service; ``extensions``: those
    the server implements (``metadata.server_extensions``), which ``ServerMetadata`` lists;
    ``shared_memory``: the system shared-memory regions, None where they are off."""
    servicer = KServeServicer(lifecycle, stream_bounds, control, extensions, shared_memory)
    add_service(kpb_grpc.add_GRPCInferenceServiceServicer_to_server, servicer, server, STREAM_METHODS)
    return servicer
