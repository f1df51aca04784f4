"""Who may talk to a model server: TLS credentials and the optional bearer token.

The unix socket is protected by its file mode; TCP listeners on other hosts than loopback
need TLS or the operator's explicit ``--allow-insecure-remote`` (checked in ``ServerConfig``).
The token, when set, guards inference, model metadata and ``/metrics`` (whose labels name the
Spark applications) over gRPC and HTTP. Health checks stay open so probes work without secrets.
"""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from fastapi import Header, HTTPException

from udfserve.services.model_server.config import ServerConfig

OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/",)
AUTHORIZATION_HEADER = "authorization"


def token_matches(expected: str, authorization: str | None) -> bool:
    """Constant-time check of an ``authorization: Bearer <token>`` value."""
    if not authorization or not authorization.startswith("Bearer "):
        return False
    return hmac.compare_digest(authorization[len("Bearer ") :].encode(), expected.encode())


def grpc_server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS (or mutual TLS) credentials for the TCP listener; None when TLS is off."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    client_ca = config.tls_client_ca_file.read_bytes() if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(config.tls_key_file.read_bytes(), config.tls_cert_file.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def check_credentials(config: ServerConfig) -> None:
    """Read the token file and the TLS files now, as the server will: a ``ValueError`` naming the
    flag and what was expected, instead of a traceback (or a "cannot listen" for a bad PEM) later."""
    config.resolve_auth_token()
    if config.tls_cert_file is None or config.tls_key_file is None:
        return
    files = [("--tls-cert-file", config.tls_cert_file), ("--tls-key-file", config.tls_key_file)]
    if config.tls_client_ca_file is not None:
        files.append(("--tls-client-ca-file", config.tls_client_ca_file))
    for flag, path in files:
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ValueError(f"{flag} {path}: expected a readable PEM file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except ssl.SSLError as exc:
        raise ValueError(
            f"--tls-cert-file {config.tls_cert_file} and --tls-key-file {config.tls_key_file}: expected a "
            f"PEM certificate (chain) and its private key ({exc.reason or exc})"
        ) from None
    if config.tls_client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca_file)
        except ssl.SSLError as exc:
            raise ValueError(
                f"--tls-client-ca-file {config.tls_client_ca_file}: expected PEM CA certificates "
                f"({exc.reason or exc})"
            ) from None


def _refusing_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler that answers UNAUTHENTICATED without reading the call's message.

    It is request-streaming whatever the method is (unary and streaming calls look the same on
    the wire): gRPC reads a unary handler's whole message before calling it, up to the message
    limit, whereas a streaming handler reads only what it asks for, and this one asks for
    nothing. The interceptor sees the call's metadata before any message is read, so a caller
    without the token costs the server its headers only."""
    message = "missing or wrong token: send metadata 'authorization: Bearer <token>'"

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    return grpc.stream_unary_rpc_method_handler(refuse)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every gRPC call but health checks unless it carries the bearer token, before its
    message is read (grpc.aio runs interceptors on the call's metadata alone)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        if token_matches(self._token, metadata.get(AUTHORIZATION_HEADER)):
            return handler
        return _refusing_handler(handler)


def http_token_dependency(token: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency that answers 401 unless the request carries the token."""

    async def require_token(authorization: str | None = Header(default=None)) -> None:
        if token is not None and not token_matches(token, authorization):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong token: send header 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return require_token
