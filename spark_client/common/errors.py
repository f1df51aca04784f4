"""Errors a Spark task fails with. Each message names the model, the server addresses and the cause."""

from __future__ import annotations


class RemotePredictError(RuntimeError):
    """Base class of the errors the client raises into a Spark task."""


class RequestRejected(RemotePredictError):
    """The server refused a batch as the caller's mistake (INVALID_ARGUMENT, NOT_FOUND, ...).

    Not a reason to fall back: the CPU would refuse the same batch, and hiding it would hide a bug.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ModelNotFound(RequestRejected):
    """The server has no model of that name, or not the version asked for (NOT_FOUND); the
    message names the model and the server, with the models (or the version) the server has.

    Never a reason to fall back: the CPU fallback reads the repository the servers load, and a
    misspelled name is a mistake to fix, not a server to route around.
    """

    def __init__(self, message: str, code: str = "NOT_FOUND") -> None:
        super().__init__(message, code)


class AuthenticationFailed(RequestRejected):
    """The server refused the client's credentials (UNAUTHENTICATED, PERMISSION_DENIED).

    A configuration error, never a reason to fall back: a job that silently ran on the CPU
    because its token was wrong would hide the mistake behind a slow job.
    """


class ClientSetupError(RemotePredictError):
    """The client's own settings cannot work where the task runs (a TLS or token file unreadable)."""


class ServerUnavailable(RemotePredictError):
    """No server answered and the policy is ``fallback="error"``, or the fallback itself could not run."""


class ModelMetadataError(RemotePredictError):
    """The driver could not learn the model's inputs and outputs. ``code`` and ``details`` are the
    server's status and text when it answered with an error."""

    def __init__(self, message: str, code: str = "", details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details
