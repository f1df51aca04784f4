"""The gRPC face of a model server: the Predict stream, model listing and metadata, and the
model control calls (answered by ``model_control_api``).

A stream's batches are decoded from Arrow IPC (inline, or read from the shared memory the stream
names) and their answers encoded here; what happens to each request in between (admission,
queueing, in-flight counting, observation) is ``request_lifecycle``'s, as for every protocol.
A failed batch is answered with the status of ``errors.failure_status`` in its own
``PredictResponse.error``; the stream goes on for the others.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from udfserve.log_text import clip
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch
from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.runtime.tensor_conversion import (
    batch_to_inputs,
    outputs_to_batch,
)
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.model_server.core.job_context import JobContext, parse_job_context
from udfserve.services.model_server.core.model_control import ModelControl
from udfserve.services.model_server.core.model_table import ModelInfo
from udfserve.services.model_server.core.pending import Pending
from udfserve.services.model_server.core.request_lifecycle import FrontEnd, InferenceRequest, RequestLifecycle
from udfserve.services.model_server.errors import failure_status
from udfserve.services.model_server.frontends import model_control_api
from udfserve.services.model_server.frontends.arrow.shared_memory import (
    DEFAULT_MAX_REGION_BYTES,
    SharedMemoryRefused,
    StreamRegions,
)
from udfserve.services.model_server.frontends.streaming import (
    DEFAULT_STREAM_BOUNDS,
    StreamBounds,
    UnparseableRequest,
    answer_inline,
    parsed_requests,
    size_as_read,
)

logger = logging.getLogger(__name__)

_STATE_TO_PROTO = {
    "loading": pb.MODEL_STATE_LOADING,
    "ready": pb.MODEL_STATE_READY,
    "failed": pb.MODEL_STATE_FAILED,
    "unloaded": pb.MODEL_STATE_UNLOADED,
    "draining": pb.MODEL_STATE_DRAINING,
}


def info_to_proto(info: ModelInfo) -> pb.ModelMetadata:
    def specs(items: list[TensorSpec]) -> list[pb.TensorSpec]:
        return [pb.TensorSpec(name=s.name, dtype=s.dtype, shape=list(s.shape)) for s in items]

    return pb.ModelMetadata(
        name=info.name,
        version=info.version,
        platform=info.platform,
        state=_STATE_TO_PROTO[info.state],
        error=info.error,
        inputs=specs(info.inputs),
        outputs=specs(info.outputs),
        max_batch_size=info.max_batch_size,
        max_queue_delay_s=info.max_queue_delay_s,
        device=info.device,
        available_versions=info.available_versions,
        served_versions=info.served_versions,
    )


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(
        self,
        lifecycle: RequestLifecycle,
        control: ModelControl,
        shared_memory_dir: Path | None = None,
        shared_memory_uids: frozenset[int] = frozenset(),
        stream_bounds: StreamBounds = DEFAULT_STREAM_BOUNDS,
        max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
    ) -> None:
        """``max_region_bytes``: the largest request a stream may name in shared memory (each is
        copied into the server's memory)."""
        self._lifecycle = lifecycle
        self._control = model_control_api.ControlCalls(control, lifecycle.models)
        self._stream_bounds = stream_bounds
        self._models = lifecycle.models
        self._metrics = lifecycle.metrics
        self._shared_memory_dir = shared_memory_dir
        self._shared_memory_uids = shared_memory_uids
        self._max_region_bytes = max_region_bytes

    def _stream_regions(self, context: grpc.aio.ServicerContext) -> StreamRegions:
        """What shared memory this stream may name: only a peer on the unix socket is on this node."""
        if self._shared_memory_dir is None:
            return StreamRegions(None, "shared memory is off on this server (--shared-memory-dir off)")
        if not context.peer().startswith("unix:"):
            return StreamRegions(
                None, "shared memory is served on the unix socket only (clients of this node)"
            )
        return StreamRegions(
            self._shared_memory_dir,
            other_uids=self._shared_memory_uids,
            max_region_bytes=self._max_region_bytes,
        )

    # -- Predict -----------------------------------------------------------------------------
    async def Predict(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        """The stream's requests come as the bytes gRPC read (``streaming.RawStreamRequests``)."""
        job = parse_job_context(context.invocation_metadata())
        regions = self._stream_regions(context)
        stream = _PredictStream(self._lifecycle, job, regions)

        def start(item: tuple[pb.PredictRequest, int]) -> pb.PredictResponse | Pending[pb.PredictResponse]:
            return stream.start(item[0])

        unreadable: list[UnparseableRequest] = []
        responses: AsyncIterator[pb.PredictResponse] = answer_inline(
            parsed_requests(request_iterator, pb.PredictRequest, unreadable),
            start,
            self._stream_bounds,
            size_as_read,
            self._metrics.streams_paused,
        )
        self._metrics.streams_active.inc()
        try:
            async for response in responses:
                yield response
            if unreadable:
                await context.abort(unreadable[0].code, unreadable[0].message)
        finally:
            self._metrics.streams_active.dec()
            regions.close()

    # -- metadata ----------------------------------------------------------------------------
    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[info_to_proto(self._models.info(m)) for m in self._models.all()])

    async def GetModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadata:
        try:
            served = self._models.get(request.model)
            if request.version and served.source and request.version != served.source.version:
                served = self._models.ready(request.model, request.version)  # raises NOT_FOUND
        except ServingError as exc:
            await context.abort(exc.code, exc.message)
        return info_to_proto(self._models.info(served))

    # -- model control (--model-control explicit) --------------------------------------------
    async def LoadModel(
        self, request: pb.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadModelResponse:
        return await model_control_api.load_model(self._control, request, context)

    async def UnloadModel(
        self, request: pb.UnloadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnloadModelResponse:
        return await model_control_api.unload_model(self._control, request, context)

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        return model_control_api.repository_index(self._control, request)


class _PredictStream(FrontEnd[pb.PredictRequest, pb.PredictResponse]):
    """The requests of one ``Predict`` stream: each batch decoded from its Arrow payload (inline
    or read from the shared memory the stream names), its answer encoded the same way."""

    def __init__(self, lifecycle: RequestLifecycle, job: JobContext, regions: StreamRegions) -> None:
        self._lifecycle = lifecycle
        self._metrics = lifecycle.metrics
        self._job = job
        self._regions = regions

    def start(self, message: pb.PredictRequest) -> pb.PredictResponse | Pending[pb.PredictResponse]:
        """Check, decode and queue one batch, inline in the stream's reader; the answer, or the
        batcher's future and what makes the answer from it. Never raises: failures become the
        response's error."""
        request = InferenceRequest(self._lifecycle, self, message, message.model, message.batch_id, self._job)
        try:
            served = request.admit(message.version)
            assert served.model is not None
            batch = self._decode(served.name, message)
            inputs = batch_to_inputs(batch, served.name, served.model.inputs)
        except Exception as exc:
            return request.refuse(exc)
        # an answer that may fit the output region it names is checked once it is known
        room_bytes = message.output_region.size if message.HasField("output_region") else None
        # the stream reads nothing more while this request waits for room (answer_inline's hold)
        return request.enqueue(inputs, batch.num_rows, room_bytes, wait_for_room=True)

    def _decode(self, model: str, message: pb.PredictRequest) -> pa.RecordBatch:
        """The request's batch, from ``arrow_ipc`` or from the shared memory it names."""
        if message.HasField("input_region"):
            if message.arrow_ipc:
                raise InvalidInput(
                    f"model {model!r}: the request carries both arrow_ipc and input_region; "
                    "expected the batch in exactly one of them"
                )
            payload: bytes | pa.Buffer = self._regions.read(
                message.input_region, "PredictRequest.input_region"
            )
            what = "PredictRequest.input_region"
            self._metrics.shared_memory_requests.inc()
        else:
            payload, what = message.arrow_ipc, "arrow_ipc"
        try:
            return decode_batch(payload, what)
        except ArrowPayloadError as exc:
            raise InvalidInput(f"model {model!r}: {exc}") from None

    def answer(
        self, request: InferenceRequest[pb.PredictRequest, pb.PredictResponse], outputs: dict[str, np.ndarray]
    ) -> pb.PredictResponse:
        """The answer: written into the request's output region when it fits there, else inline."""
        served, message = request.served, request.message
        assert served.source is not None
        answer = outputs_to_batch(outputs, request.outputs)
        if message.HasField("output_region"):
            written = self._regions.write(message.output_region, "PredictRequest.output_region", answer)
            if written is not None:
                version = served.source.version
                return pb.PredictResponse(
                    batch_id=message.batch_id, output_region_bytes=written, model_version=version
                )
        payload = encode_batch(answer)
        request.check_answer_size(len(payload))
        return pb.PredictResponse(
            batch_id=message.batch_id, arrow_ipc=payload, model_version=served.source.version
        )

    def refusal(
        self, request: InferenceRequest[pb.PredictRequest, pb.PredictResponse], exc: Exception
    ) -> tuple[grpc.StatusCode, pb.PredictResponse]:
        """The error answer to one batch: a ``ServingError`` with its status, anything else INTERNAL."""
        message = request.message
        code, text = failure_status(exc, f"model '{clip(message.model)}' batch {message.batch_id}")
        response = pb.PredictResponse(
            batch_id=message.batch_id, error=pb.Error(code=code.value[0], message=text)
        )
        if isinstance(exc, SharedMemoryRefused):
            response.shared_memory_refused = True
            self._metrics.shared_memory_refusals.inc()
        return code, response
