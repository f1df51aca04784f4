"""The one place that picks the protocol: udfserve's Arrow stream or KServe v2.

Everything above this module (routing, fallback, re-chunking, counters) is the same for both;
everything below it is one protocol's. ``tritonclient`` is imported only when a job speaks
KServe v2, so the Arrow path keeps the Python worker as light as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from udfserve.spark_client.common.errors import ClientSetupError
from udfserve.spark_client.common.model_spec import ModelSpec
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.arrow_wire import arrow_stream
from udfserve.spark_client.wire.channels import connect
from udfserve.spark_client.wire.credentials import CallMetadata
from udfserve.spark_client.wire.transport import PredictStream


@dataclass(frozen=True)
class DescribedModel:
    """A model's spec, and the most rows one request may carry (0: no limit)."""

    spec: ModelSpec
    max_rows_per_request: int = 0


def describe_model(
    target: str, config: TaskConfig, model: str, metadata: CallMetadata = ()
) -> DescribedModel:
    """The model as the server at ``target`` describes it; raises ``ConnectFailed`` as ``connect``."""
    if config.protocol == "kserve":
        kserve = _kserve()
        _, kserve_model = connect(target, config, model, metadata, kserve.describe_kserve_model)
        return DescribedModel(kserve_model.spec, kserve_model.max_batch_size)
    spec: ModelSpec
    _, spec = connect(target, config, model, metadata)
    return DescribedModel(spec)


def open_stream(target: str, config: TaskConfig, model: str, metadata: CallMetadata = ()) -> PredictStream:
    """A connected ``PredictStream`` to ``target``; raises ``ConnectFailed`` as ``connect``.

    The metadata call inside ``connect`` is here the readiness check (the server is up, accepts
    the token and has the model), and the Arrow protocol's answer to it is not kept: the job's
    columns were fixed by ``describe_model`` when the UDF was built, and every answer is checked
    against them as it arrives (``partition._conform_one``). The KServe wire does keep its
    answer, because it builds each request from the peer's declared inputs.
    """
    if config.protocol == "kserve":
        kserve = _kserve()
        channel, kserve_model = connect(target, config, model, metadata, kserve.describe_kserve_model)
        return kserve.kserve_stream(channel, target, kserve_model, config, metadata)
    channel, _ = connect(target, config, model, metadata)
    return arrow_stream(channel, target, model, config, metadata)


def _kserve() -> ModuleType:
    try:
        from udfserve.spark_client.wire import kserve_transport
    except ImportError as exc:
        raise ClientSetupError(
            f"protocol='kserve' needs tritonclient's gRPC code where the call is made ({exc}); install "
            "udfserve with the 'kserve' extra (pip install 'udfserve[kserve]') on the driver and executors"
        ) from exc
    return kserve_transport
