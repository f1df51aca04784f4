"""One exception hierarchy for the server, each class carrying the gRPC status it maps to.

A failure of one request is raised as one of these and goes back to that request only
(``grpc_api`` maps it to the wire in one place). Anything else escaping a backend is a real
fault and is reported as INTERNAL with its text.
"""

from __future__ import annotations

import logging

import grpc

logger = logging.getLogger(__name__)


class ServingError(Exception):
    """Base class: a request failed for a reason the client should be told about."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServingError):
    """The batch does not match the model: names the column, what was expected, what came."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ModelNotFound(ServingError):
    code = grpc.StatusCode.NOT_FOUND


class QueueFull(ServingError):
    """Back-pressure: the client should retry later, this is not a failure of the batch."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ModelUnavailable(ServingError):
    """The model is loading, failed to load, or the server is draining."""

    code = grpc.StatusCode.UNAVAILABLE


class BackendFault(ServingError):
    """The framework raised while running a batch that passed validation."""

    code = grpc.StatusCode.INTERNAL


class DeviceOutOfMemory(BackendFault):
    """The framework could not allocate memory for a batch (its own resource-exhausted error).

    A smaller batch may fit: the batcher splits the call in halves and lowers its batch limit.
    Only a single row that does not fit alone reaches the client, as RESOURCE_EXHAUSTED: the
    memory may be free again later (another model released it), so a retry is not pointless.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the model and the file."""


def failure_status(exc: Exception, what: str) -> tuple[grpc.StatusCode, str]:
    """The status and message one failed request is answered with: a ``ServingError``'s own, else
    INTERNAL with the exception's text, logged with its traceback as the fault it is. ``what``
    names the request in that log line."""
    if isinstance(exc, ServingError):
        return exc.code, exc.message
    logger.error("unexpected failure answering %s", what, exc_info=(type(exc), exc, exc.__traceback__))
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
