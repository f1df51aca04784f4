"""Channels to model servers, one per worker process and target, and what a server says of a
model: connecting (``connect``) and reading its inputs and outputs (``GetModelMetadata``).

A channel is kept for the life of the Python worker, so the tasks a worker runs share its
connection; a target whose connection failed is forgotten, so the next task dials it anew."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.spark_client.common.errors import AuthenticationFailed, ModelMetadataError, ModelNotFound
from udfserve.spark_client.common.model_spec import ModelSpec, spec_from_tensors
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.credentials import CallMetadata, channel_credentials, uses_tls
from udfserve.spark_client.wire.wire import AUTH_ERROR_CODES

logger = logging.getLogger(__name__)

ChannelKey = tuple[str, int, tuple[str | None, ...]]
_channels: dict[ChannelKey, grpc.Channel] = {}
_channels_lock = threading.Lock()


class ConnectFailed(ConnectionError):
    """No connection to the target within the connect timeout."""


def _channel_key(target: str, config: TaskConfig) -> ChannelKey:
    tls = (
        (
            config.tls_root_certificates_file,
            config.tls_client_certificate_file,
            config.tls_client_key_file,
            config.tls_server_name,
        )
        if uses_tls(target, config)
        else ()
    )
    return (target, config.max_message_bytes, tls)


def channel_for(target: str, config: TaskConfig) -> grpc.Channel:
    """The worker process's channel to ``target``, created once and reused by every later task.

    TCP targets get TLS when the config names any TLS file; unix sockets stay plaintext.
    """
    key = _channel_key(target, config)
    with _channels_lock:
        channel = _channels.get(key)
        if channel is None:
            options: list[tuple[str, int | str]] = [
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_permit_without_calls", 0),
            ]
            if uses_tls(target, config):
                if config.tls_server_name:
                    options.append(("grpc.ssl_target_name_override", config.tls_server_name))
                channel = grpc.secure_channel(target, channel_credentials(config), options=options)
            else:
                channel = grpc.insecure_channel(target, options=options)
            _channels[key] = channel
        return channel


def forget_channel(target: str, config: TaskConfig) -> None:
    """Drop a failed channel so the next task dials afresh instead of waiting out gRPC's back-off."""
    with _channels_lock:
        channel = _channels.pop(_channel_key(target, config), None)
    if channel is not None:
        channel.close()


Described = TypeVar("Described")


def connect(
    target: str,
    config: TaskConfig,
    model: str,
    metadata: CallMetadata = (),
    describe: Callable[[grpc.Channel, str, str, int, float, CallMetadata], Described] | None = None,
) -> tuple[grpc.Channel, Described]:
    """A channel to ``target`` whose server has ``model`` ready, and the model as ``describe`` tells it.

    Asking for the model's metadata is the connection check: it fails fast when nothing
    listens, and it proves the server can answer for this model before any batch is sent.
    ``describe`` is the protocol's way of asking (default: the Arrow protocol's
    ``fetch_model_spec``). Raises ``ConnectFailed`` with the reason, ``AuthenticationFailed``
    when the server refuses the client's token or certificate, or ``ModelNotFound`` when it has
    no such model (another server of the node loads the same repository: none is tried).
    """
    ask: Callable[..., Any] = describe or fetch_model_spec
    if target.startswith("unix:"):
        path = Path(target.removeprefix("unix:").removeprefix("//"))
        if not path.exists():
            raise ConnectFailed(f"{target}: socket file {path} does not exist")
    channel = channel_for(target, config)
    try:
        described = ask(channel, target, model, config.model_version, config.connect_timeout_s, metadata)
    except ModelMetadataError as exc:
        forget_channel(target, config)
        if exc.code in {c.name for c in AUTH_ERROR_CODES}:
            raise AuthenticationFailed(
                f"{exc}; set ClientConfig.auth_token or auth_token_file (Spark conf "
                "spark.udfserve.authToken or spark.udfserve.authTokenFile) to the server's token",
                exc.code,
            ) from None
        if exc.code == grpc.StatusCode.NOT_FOUND.name:
            version = f" version {config.model_version}" if config.model_version else ""
            raise ModelNotFound(
                f"model {model!r}{version} does not exist on the server at {target}: {exc.details}"
            ) from None
        raise ConnectFailed(str(exc)) from None
    return channel, described


def fetch_model_spec(
    channel: grpc.Channel,
    target: str,
    model: str,
    version: int,
    timeout_s: float,
    metadata: CallMetadata = (),
) -> ModelSpec:
    """The model's inputs and outputs as the server describes them (``GetModelMetadata``)."""
    stub = pb_grpc.InferenceStub(channel)
    try:
        meta = stub.GetModelMetadata(
            pb.ModelMetadataRequest(model=model, version=version), timeout=timeout_s, metadata=metadata
        )
    except grpc.RpcError as exc:
        raise ModelMetadataError(
            f"server {target} could not describe model {model!r} (version {version or 'default'}): "
            f"{exc.code().name}: {exc.details()}",
            exc.code().name,
            exc.details() or "",
        ) from None
    if meta.state != pb.MODEL_STATE_READY:
        state = pb.ModelState.Name(meta.state)
        raise ModelMetadataError(
            f"server {target}: model {model!r} is {state}, expected MODEL_STATE_READY"
            + (f": {meta.error}" if meta.error else "")
        )
    return spec_from_tensors(
        meta.name,
        meta.version,
        [(t.name, t.dtype, t.shape) for t in meta.inputs],
        [(t.name, t.dtype, t.shape) for t in meta.outputs],
    )
