"""The errors of running a model, raised wherever the runtime runs: in the model server, and in
the Spark client's CPU fallback.

Each class carries the gRPC status that a server answers it with (so this module imports
grpcio, as the wire contract of this package does); the server adds the errors of its own state
(unknown model, full queue, draining) and maps every one to the wire in one place
(``udfserve.services.model_server.errors.failure_status``). The CPU fallback turns them into the client's
own errors. Anything else escaping a backend is a real fault and is reported as INTERNAL with its
text.
"""

from __future__ import annotations

import grpc


class ServingError(Exception):
    """Base class: a request failed for a reason the client should be told about."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServingError):
    """The batch does not match the model: names the column, what was expected, what came."""

    code = grpc.StatusCode.INVALID_ARGUMENT


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


class BackendNotInstalled(ModelLoadError):
    """The backend a model needs is not installed in this process's environment; the message
    names the model, the backend and the extra that installs it. The server serves its other
    models."""
