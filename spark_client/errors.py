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


class ServerUnavailable(RemotePredictError):
    """No server answered and the policy is ``fallback="error"``, or the fallback itself could not run."""


class ModelMetadataError(RemotePredictError):
    """The driver could not learn the model's inputs and outputs."""
