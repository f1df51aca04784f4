"""The server's own errors, and the one place that maps every error of a request to the wire.

The errors of running a model (``InvalidInput``, ``BackendFault``, ``DeviceOutOfMemory``,
``ModelLoadError``) belong to the runtime, ``udfserve.runtime.errors``, which the CPU fallback
runs too; the ones here are about the server's state: an unknown model, a full queue, a model
that is loading or a server that is draining. Every class carries the gRPC status it maps to.
A failure of one request is raised as one of these and goes back to that request only
(``failure_status``). Anything else escaping a backend is a real fault and is reported as
INTERNAL with its text.
"""

from __future__ import annotations

import logging

import grpc

from udfserve.runtime.errors import ServingError

logger = logging.getLogger(__name__)


class ModelNotFound(ServingError):
    code = grpc.StatusCode.NOT_FOUND


class QueueFull(ServingError):
    """Back-pressure: the client should retry later, this is not a failure of the batch."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ModelUnavailable(ServingError):
    """The model is loading, failed to load, or the server is draining."""

    code = grpc.StatusCode.UNAVAILABLE


def failure_status(exc: Exception, what: str) -> tuple[grpc.StatusCode, str]:
    """The status and message one failed request is answered with: a ``ServingError``'s own, else
    INTERNAL with the exception's text, logged with its traceback as the fault it is. ``what``
    names the request in that log line."""
    if isinstance(exc, ServingError):
        return exc.code, exc.message
    logger.error("unexpected failure answering %s", what, exc_info=(type(exc), exc, exc.__traceback__))
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
