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

from udfserve.log_text import clip, error_line
from udfserve.runtime.errors import ServingError

logger = logging.getLogger(__name__)

STATUS_MESSAGE_CHARS = 1000
"""The longest message a refusal carries. Messages quote what the client sent (names of inputs,
outputs, columns); a gRPC status travels in the trailers, which clients accept up to 16 KiB
(percent-encoded): a longer one reaches the client as RESOURCE_EXHAUSTED ("received metadata size
exceeds hard limit") instead of its status."""


class ModelNotFound(ServingError):
    code = grpc.StatusCode.NOT_FOUND


class QueueFull(ServingError):
    """Back-pressure: the client should retry later, this is not a failure of the batch."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ModelUnavailable(ServingError):
    """The model is loading, failed to load, or the server is draining."""

    code = grpc.StatusCode.UNAVAILABLE


class ModelSwapping(QueueFull):
    """``--version-swap unload-first``: the model holds no version while the new one loads. A
    client backs off and resends (RESOURCE_EXHAUSTED) rather than falling back."""


class ModelControlRefused(ServingError):
    """A load or unload call on a server whose models do not change by call."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ModelLoadFailed(ServingError):
    """A load call whose versions could not be loaded (the versions serving keep serving)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def failure_status(exc: Exception, what: str) -> tuple[grpc.StatusCode, str]:
    """The status and message one failed request is answered with: a ``ServingError``'s own (at
    most ``STATUS_MESSAGE_CHARS``), else INTERNAL with the first line of the exception's text
    (``error_line``), logged with its traceback as the fault it is. ``what`` names the request in
    that log line (client text in it clipped by the caller)."""
    if isinstance(exc, ServingError):
        return exc.code, clip(exc.message, STATUS_MESSAGE_CHARS)
    logger.error("unexpected failure answering %s", what, exc_info=(type(exc), exc, exc.__traceback__))
    return grpc.StatusCode.INTERNAL, error_line(exc)
