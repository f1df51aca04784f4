"""KServe v2 (the protocol of NVIDIA Triton) as a ``Wire`` of ``PredictStream``.

With ``protocol="kserve"`` a UDF can call any KServe v2 gRPC server: udfserve's own KServe
endpoint (on the same port as its Arrow service) or a real Triton Inference Server. The calls
use the generated service definitions and messages that ``tritonclient.grpc`` ships (the ones
its ``InferenceServerClient`` is built on), over the client's own channel, so TLS, the bearer
token, the message limits and the channel reuse are those of the Arrow protocol; the tensors
are built and read by ``kserve_messages`` with the tensor rules of ``udfserve.kserve_tensors``,
which the server side uses too.

Each batch is one unary ``ModelInfer`` call, not a ``ModelStreamInfer`` stream: Triton answers a
stream's failed request with a message and no status code, while a unary call ends with the
code the client's retry rules need (INVALID_ARGUMENT refuses the batch, UNAVAILABLE stops
sending, ...). The calls are concurrent, up to ``max_in_flight`` of them, so the server can
batch them together as it batches a stream's requests.

Triton reports a full queue as UNAVAILABLE with the text ``Exceeds maximum queue size``, not as
RESOURCE_EXHAUSTED; that answer is read as the back-off signal it is, so a busy Triton is
waited for, not abandoned for the CPU. udfserve's KServe endpoint answers the same way.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
from tritonclient.grpc import service_pb2, service_pb2_grpc

from udfserve.kserve_tensors import NUMPY_DTYPE_OF, KServeCodecError, TensorSpec
from udfserve.spark_client.common.errors import ModelMetadataError, RequestRejected
from udfserve.spark_client.common.model_spec import ModelSpec, Tensor
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.common.versions import kserve_version
from udfserve.spark_client.wire.credentials import CallMetadata
from udfserve.spark_client.wire.kserve_messages import (
    arrow_batch_to_infer_request,
    infer_response_to_arrow,
    specs_from_config,
    specs_from_metadata,
)
from udfserve.spark_client.wire.transport import PredictStream
from udfserve.spark_client.wire.wire import Reply, StreamBroken

logger = logging.getLogger(__name__)

QUEUE_FULL_TEXT = "exceeds maximum queue size"
"""How Triton (and udfserve's KServe endpoint) words a refusal by a full queue, in lower case."""

STRING_DTYPE = "string"
"""The client's dtype name of a KServe BYTES tensor."""


@dataclass(frozen=True)
class KServeModel:
    """A model as a KServe v2 server describes it, and the same as the client's ``ModelSpec``.

    ``max_batch_size`` is the most rows the server takes in one request (0: it did not say);
    Triton refuses a bigger request, so the driver cuts requests to it.
    """

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            version=int(self.version) if self.version.isdigit() else 0,
            inputs=tuple(_tensor(t, self.name) for t in self.inputs),
            outputs=tuple(_tensor(t, self.name) for t in self.outputs),
        )


def _tensor(spec: TensorSpec, model: str) -> Tensor:
    if spec.datatype == "BYTES":
        return Tensor(spec.name, STRING_DTYPE, spec.shape)
    dtype = NUMPY_DTYPE_OF.get(spec.datatype)
    if dtype is None:
        raise ModelMetadataError(
            f"model {model!r}: tensor {spec.name!r} has datatype {spec.datatype}; expected one of "
            f"{', '.join([*NUMPY_DTYPE_OF, 'BYTES'])}"
        )
    return Tensor(spec.name, np.dtype(dtype).name, spec.shape)


def describe_kserve_model(
    channel: grpc.Channel,
    target: str,
    model: str,
    version: int,
    timeout_s: float,
    metadata: CallMetadata = (),
) -> KServeModel:
    """The model's tensors from ``ModelMetadata``, refined by ``ModelConfig`` where the server has it.

    ``ModelMetadata`` is the connection check, as ``GetModelMetadata`` is for the Arrow protocol
    (NOT_FOUND names an unknown model); ``ModelReady`` then proves the model can infer.
    ``ModelConfig`` is Triton's extension: when the server does not implement it the metadata
    alone describes the model (per-row shapes as declared, no batch-size limit).
    """
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    wanted = str(version) if version else ""
    where = f"server {target} (KServe v2)"
    described = f"model {model!r} (version {wanted or 'default'})"

    def call(method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise ModelMetadataError(
                f"{where} could not describe {described}: {exc.code().name}: {exc.details()}",
                exc.code().name,
                exc.details() or "",
            ) from None

    meta = call(stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=model, version=wanted))
    ready = call(stub.ModelReady, service_pb2.ModelReadyRequest(name=model, version=wanted))
    if not ready.ready:
        raise ModelMetadataError(f"{where}: {described} is not ready; expected a model ready to infer")
    try:
        inputs, outputs = specs_from_metadata(meta)
        max_batch_size = 0
        try:
            request = service_pb2.ModelConfigRequest(name=model, version=wanted)
            config = stub.ModelConfig(request, timeout=timeout_s, metadata=metadata).config
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise ModelMetadataError(
                    f"{where} could not give the configuration of {described}: {exc.code().name}: "
                    f"{exc.details()}",
                    exc.code().name,
                ) from None
            logger.debug("%s has no ModelConfig; describing %s from its metadata", where, described)
        else:
            inputs, outputs = specs_from_config(config)
            max_batch_size = config.max_batch_size
    except KServeCodecError as exc:
        raise ModelMetadataError(f"{where}: {exc}") from None
    return KServeModel(
        name=meta.name or model,
        version=wanted or _newest(meta.versions),
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
    )


class KServeWire:
    """Each batch a unary ``ModelInfer`` call; the answers come back as ``Reply`` events."""

    def __init__(
        self, channel: grpc.Channel, model: KServeModel, config: TaskConfig, metadata: CallMetadata = ()
    ) -> None:
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._model = model
        self._version = str(config.model_version) if config.model_version else ""
        self._timeout_s = config.request_timeout_s
        self._metadata = metadata
        self._calls: dict[int, grpc.Future] = {}
        self._lock = threading.Lock()
        self._events: queue.Queue[object] | None = None

    def open(self, events: queue.Queue[object]) -> None:
        self._events = events

    def send(self, batch_id: int, batch: pa.RecordBatch) -> bool:
        try:
            request = arrow_batch_to_infer_request(
                batch,
                self._model.name,
                self._version,
                str(batch_id),
                input_specs=self._model.inputs,
            )
        except KServeCodecError as exc:
            raise RequestRejected(
                f"a batch of {batch.num_rows} rows cannot be sent to model {self._model.name!r} over "
                f"KServe v2: {exc}",
                grpc.StatusCode.INVALID_ARGUMENT.name,
            ) from None
        call = self._stub.ModelInfer.future(request, timeout=self._timeout_s, metadata=self._metadata)
        with self._lock:
            self._calls[batch_id] = call
        call.add_done_callback(functools.partial(self._answered, batch_id))
        return False  # KServe's tensors travel in the message

    def finish(self) -> bool:
        return True  # every call has ended: the stream waited for each answer

    def cancel(self) -> None:
        with self._lock:
            calls = list(self._calls.values())
            self._calls.clear()
        for call in calls:
            call.cancel()

    def _answered(self, batch_id: int, call: grpc.Future) -> None:
        """On gRPC's thread: the outputs read into Arrow, or the status as the stream's rules see it."""
        with self._lock:
            self._calls.pop(batch_id, None)
        if call.cancelled():
            return
        assert self._events is not None
        error = call.exception()
        if error is not None:
            self._events.put(_error_reply(batch_id, error))
            return
        response = call.result()
        try:
            result = infer_response_to_arrow(response, self._model.outputs)
        except KServeCodecError as exc:
            self._events.put(Reply(batch_id, unreadable=str(exc)))
            return
        except Exception as exc:  # gRPC would swallow it, and the batch would wait out its deadline
            self._events.put(Reply(batch_id, unreadable=f"{type(exc).__name__}: {exc}"))
            return
        self._events.put(Reply(batch_id, result=result, version=kserve_version(response.model_version)))


def _error_reply(batch_id: int, error: BaseException) -> Reply | StreamBroken:
    if not isinstance(error, grpc.RpcError):
        return StreamBroken(grpc.StatusCode.UNKNOWN, f"{type(error).__name__}: {error}")
    code, details = error.code(), error.details() or ""
    if code is grpc.StatusCode.UNAVAILABLE and QUEUE_FULL_TEXT in details.lower():
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    return Reply(batch_id, code=code, message=details)


def kserve_stream(
    channel: grpc.Channel, target: str, model: KServeModel, config: TaskConfig, metadata: CallMetadata = ()
) -> PredictStream:
    """A ``PredictStream`` over KServe v2."""
    return PredictStream(KServeWire(channel, model, config, metadata), target, model.name, config)


def _newest(versions: Sequence[str]) -> str:
    """The version a request naming none gets: the highest the metadata lists ("" for none)."""
    numbers = [int(version) for version in versions if version.isdigit()]
    return str(max(numbers)) if numbers else (versions[0] if versions else "")
