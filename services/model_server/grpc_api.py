"""The gRPC face of a model server: the Predict stream, model listing and metadata.

Exceptions of ``errors.py`` are mapped to the wire here and nowhere else. A failed batch is
answered in its own ``PredictResponse.error``; the stream goes on for the others.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from services.model_server.errors import failure_status
from services.model_server.in_flight import InFlightRequests
from services.model_server.job_context import JobContext, parse_job_context
from services.model_server.metrics import ModelMetrics, ServerMetrics
from services.model_server.models import ModelInfo, ModelTable, ServedModel
from services.model_server.shared_memory import SharedMemoryRefused, StreamRegions
from services.model_server.streaming import MAX_IN_FLIGHT_PER_STREAM, Pending, answer_inline
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch
from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.runtime.tensor_conversion import (
    answer_bytes_at_least,
    batch_to_inputs,
    check_answer_size,
    outputs_to_batch,
)
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.shared_memory import write_ipc_into

logger = logging.getLogger(__name__)

_STATE_TO_PROTO = {
    "loading": pb.MODEL_STATE_LOADING,
    "ready": pb.MODEL_STATE_READY,
    "failed": pb.MODEL_STATE_FAILED,
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
    )


def _empty_outputs(served: ServedModel) -> dict[str, np.ndarray]:
    assert served.model is not None
    return {
        spec.name: np.zeros((0, *(max(d, 0) for d in spec.shape)), dtype=spec.dtype)
        for spec in served.model.outputs
    }


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(
        self,
        models: ModelTable,
        metrics: ServerMetrics,
        max_message_bytes: int,
        in_flight: InFlightRequests,
        shared_memory_dir: Path | None = None,
        shared_memory_uids: frozenset[int] = frozenset(),
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._max_response_bytes = max_message_bytes - 1024  # room for the protobuf envelope
        self._in_flight = in_flight
        self._shared_memory_dir = shared_memory_dir
        self._shared_memory_uids = shared_memory_uids

    def _stream_regions(self, context: grpc.aio.ServicerContext) -> StreamRegions:
        """What shared memory this stream may name: only a peer on the unix socket is on this node."""
        if self._shared_memory_dir is None:
            return StreamRegions(None, "shared memory is off on this server (--shared-memory-dir off)")
        if not context.peer().startswith("unix:"):
            return StreamRegions(
                None, "shared memory is served on the unix socket only (clients of this node)"
            )
        return StreamRegions(self._shared_memory_dir, other_uids=self._shared_memory_uids)

    # -- Predict -----------------------------------------------------------------------------
    async def Predict(
        self, request_iterator: AsyncIterator[pb.PredictRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        job = parse_job_context(context.invocation_metadata())
        regions = self._stream_regions(context)
        start = functools.partial(self._start, job=job, regions=regions)
        responses: AsyncIterator[pb.PredictResponse] = answer_inline(
            request_iterator, start, MAX_IN_FLIGHT_PER_STREAM
        )
        self._metrics.streams_active.inc()
        try:
            async for response in responses:
                yield response
        finally:
            self._metrics.streams_active.dec()
            regions.close()

    def _start(
        self, request: pb.PredictRequest, job: JobContext, regions: StreamRegions
    ) -> pb.PredictResponse | Pending[pb.PredictResponse]:
        """Check, decode and queue one batch, inline in the stream's reader; the answer, or the
        batcher's future and what makes the answer from it. Never raises: failures become the
        response's error."""
        started_s = time.perf_counter()
        model_metrics = self._models.metrics_of(request.model)
        try:
            served = self._models.ready(request.model, request.version)
            assert served.model is not None and served.batcher is not None and served.metrics is not None
            model_metrics = served.metrics
            batch = self._decode(served, request, regions)
            inputs = batch_to_inputs(batch, served.name, served.model.inputs)
            rows = batch.num_rows
            self._check_answer_fits(served, request, rows)
            if rows == 0:
                response = self._respond(served, request, _empty_outputs(served), rows, regions)
                self._observe(model_metrics, job, request, grpc.StatusCode.OK, started_s, rows)
                return response
            future = served.batcher.enqueue(inputs)
        except Exception as exc:
            return self._refuse(model_metrics, job, request, exc, started_s)
        self._in_flight.begin()
        model_metrics.in_flight.inc()
        finish = functools.partial(
            self._finish, served, model_metrics, job, request, regions, rows, started_s
        )
        return Pending(future, finish)

    def _check_answer_fits(self, served: ServedModel, request: pb.PredictRequest, rows: int) -> None:
        """Refuse, before any backend call, a request whose answer cannot fit the message limit
        nor the output region it names (the check after the call stays for what only the model
        knows: strings, free dimensions)."""
        assert served.model is not None
        at_least = answer_bytes_at_least(served.model.outputs, rows)
        if request.HasField("output_region") and request.output_region.size >= at_least:
            return  # it may fit the region; if it does not, the check after the call answers
        check_answer_size(served.name, rows, at_least, self._max_response_bytes, before_running=True)

    def _decode(
        self, served: ServedModel, request: pb.PredictRequest, regions: StreamRegions
    ) -> pa.RecordBatch:
        """The request's batch, from ``arrow_ipc`` or from the shared memory it names."""
        if request.HasField("input_region"):
            if request.arrow_ipc:
                raise InvalidInput(
                    f"model {served.name!r}: the request carries both arrow_ipc and input_region; "
                    "expected the batch in exactly one of them"
                )
            payload: bytes | pa.Buffer = regions.bytes_of(request.input_region, "PredictRequest.input_region")
            what = "PredictRequest.input_region"
            self._metrics.shared_memory_requests.inc()
        else:
            payload, what = request.arrow_ipc, "arrow_ipc"
        try:
            return decode_batch(payload, what)
        except ArrowPayloadError as exc:
            raise InvalidInput(f"model {served.name!r}: {exc}") from None

    def _finish(
        self,
        served: ServedModel,
        model_metrics: ModelMetrics,
        job: JobContext,
        request: pb.PredictRequest,
        regions: StreamRegions,
        rows: int,
        started_s: float,
        outputs: asyncio.Future[dict[str, np.ndarray]],
    ) -> pb.PredictResponse:
        """The answer to one batch once the batcher answered it (or the stream closed first, and
        the answer is not wanted)."""
        self._in_flight.end()
        model_metrics.in_flight.dec()
        if outputs.cancelled():
            raise asyncio.CancelledError
        try:
            response = self._respond(served, request, outputs.result(), rows, regions)
        except Exception as exc:
            return self._refuse(model_metrics, job, request, exc, started_s)
        self._observe(model_metrics, job, request, grpc.StatusCode.OK, started_s, rows)
        return response

    def _respond(
        self,
        served: ServedModel,
        request: pb.PredictRequest,
        outputs: dict[str, np.ndarray],
        rows: int,
        regions: StreamRegions,
    ) -> pb.PredictResponse:
        """The answer: written into the request's output region when it fits there, else inline."""
        assert served.model is not None and served.source is not None
        answer = outputs_to_batch(outputs, served.model.outputs)
        if request.HasField("output_region"):
            room = regions.bytes_of(request.output_region, "PredictRequest.output_region")
            written = write_ipc_into(room, answer)
            if written is not None:
                version = served.source.version
                return pb.PredictResponse(
                    batch_id=request.batch_id, output_region_bytes=written, model_version=version
                )
        payload = encode_batch(answer)
        check_answer_size(served.name, rows, len(payload), self._max_response_bytes)
        return pb.PredictResponse(
            batch_id=request.batch_id, arrow_ipc=payload, model_version=served.source.version
        )

    def _refuse(
        self,
        model_metrics: ModelMetrics | None,
        job: JobContext,
        request: pb.PredictRequest,
        exc: Exception,
        started_s: float,
    ) -> pb.PredictResponse:
        """The error answer to one batch: a ``ServingError`` with its status, anything else INTERNAL."""
        code, message = failure_status(exc, f"model {request.model!r} batch {request.batch_id}")
        self._observe(model_metrics, job, request, code, started_s, 0)
        response = self._error(request.batch_id, code, message)
        if isinstance(exc, SharedMemoryRefused):
            response.shared_memory_refused = True
            self._metrics.shared_memory_refusals.inc()
        return response

    def _observe(
        self,
        model_metrics: ModelMetrics | None,
        job: JobContext,
        request: pb.PredictRequest,
        code: grpc.StatusCode,
        started_s: float,
        rows: int,
    ) -> None:
        seconds = time.perf_counter() - started_s
        self._metrics.observe_answer(model_metrics, job, request.batch_id, code.name, seconds, rows)

    @staticmethod
    def _error(batch_id: int, code: grpc.StatusCode, message: str) -> pb.PredictResponse:
        return pb.PredictResponse(batch_id=batch_id, error=pb.Error(code=code.value[0], message=message))

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
