"""The gRPC face of a model server: the Predict stream, model listing and metadata.

Exceptions of ``errors.py`` are mapped to the wire here and nowhere else. A failed batch is
answered in its own ``PredictResponse.error``; the stream goes on for the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np

from services.model_server.config import TensorSpec
from services.model_server.errors import InvalidInput, ServingError
from services.model_server.in_flight import InFlightRequests
from services.model_server.job_context import JobContext, parse_job_context
from services.model_server.metrics import ServerMetrics
from services.model_server.models import ModelInfo, ModelTable, ServedModel
from services.model_server.schema import batch_to_inputs, outputs_to_batch
from services.model_server.streaming import MAX_IN_FLIGHT_PER_STREAM, answer_concurrently
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch

logger = logging.getLogger(__name__)

UNKNOWN_MODEL_LABEL = "<unknown>"
"""Metrics label of requests naming no model of the repository: labels never carry what a
client typed, so their number stays bounded."""

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
        self, models: ModelTable, metrics: ServerMetrics, max_message_bytes: int, in_flight: InFlightRequests
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._max_response_bytes = max_message_bytes - 1024  # room for the protobuf envelope
        self._in_flight = in_flight

    # -- Predict -----------------------------------------------------------------------------
    async def Predict(
        self, request_iterator: AsyncIterator[pb.PredictRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        job = parse_job_context(context.invocation_metadata())

        async def answer(request: pb.PredictRequest) -> pb.PredictResponse:
            return await self._predict(request, job)

        self._metrics.streams_active.inc()
        try:
            async for response in answer_concurrently(request_iterator, answer, MAX_IN_FLIGHT_PER_STREAM):
                yield response
        finally:
            self._metrics.streams_active.dec()

    async def _predict(self, request: pb.PredictRequest, job: JobContext) -> pb.PredictResponse:
        """Answer one batch; never raises: failures become the response's error."""
        started = time.perf_counter()
        with self._in_flight.track():
            model_label, code, rows, response = await self._answer(request)
        seconds = time.perf_counter() - started
        self._metrics.observe_request(model_label, code.name, seconds, rows)
        self._metrics.applications.observe(job, model_label, request.batch_id, code.name, seconds, rows)
        return response

    async def _answer(
        self, request: pb.PredictRequest
    ) -> tuple[str, grpc.StatusCode, int, pb.PredictResponse]:
        """(metrics label, status, rows answered, response) of one batch."""
        model_label = UNKNOWN_MODEL_LABEL
        try:
            served = self._models.ready(request.model, request.version)
            model_label = served.name
            self._metrics.in_flight.labels(model=model_label).inc()
            try:
                payload, rows = await self._run(served, request)
            finally:
                self._metrics.in_flight.labels(model=model_label).dec()
            assert served.source is not None
            response = pb.PredictResponse(
                batch_id=request.batch_id, arrow_ipc=payload, model_version=served.source.version
            )
            return model_label, grpc.StatusCode.OK, rows, response
        except ServingError as exc:
            return model_label, exc.code, 0, self._error(request.batch_id, exc.code, exc.message)
        except Exception as exc:
            logger.exception(
                "unexpected failure answering model %r batch %d", request.model, request.batch_id
            )
            code = grpc.StatusCode.INTERNAL
            return model_label, code, 0, self._error(request.batch_id, code, f"{type(exc).__name__}: {exc}")

    async def _run(self, served: ServedModel, request: pb.PredictRequest) -> tuple[bytes, int]:
        assert served.model is not None and served.batcher is not None
        try:
            batch = decode_batch(request.arrow_ipc)
        except ArrowPayloadError as exc:
            raise InvalidInput(f"model {served.name!r}: {exc}") from None
        inputs = batch_to_inputs(batch, served.name, served.model.inputs)
        if batch.num_rows == 0:
            outputs = _empty_outputs(served)
        else:
            outputs = await served.batcher.submit(inputs)
        payload = encode_batch(outputs_to_batch(outputs, served.model.outputs))
        if len(payload) > self._max_response_bytes:
            raise InvalidInput(
                f"model {served.name!r}: the answer to {batch.num_rows} rows is {len(payload)} bytes, over "
                f"the {self._max_response_bytes} byte message limit; send fewer rows per request"
            )
        return payload, batch.num_rows

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
