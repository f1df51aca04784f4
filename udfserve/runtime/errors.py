"""The errors of running a model, raised wherever the runtime runs: in the model server, and in
the Spark client's CPU fallback.

Each class carries the gRPC status that a server answers it with (so this module imports
grpcio, as the wire contract of this package does); the server adds the errors of its own state
(unknown model, full queue, draining) and maps every one to the wire in one place
(``udfserve.services.model_server.errors.failure_status``). The CPU fallback turns them into the client's
own errors. Anything else escaping a backend is a real fault and is reported as INTERNAL with its
text.

A model's code can also raise what is not an ``Exception``: the Rust libraries bound with PyO3
(``tokenizers``, ``safetensors``) raise a panic as ``pyo3_runtime.PanicException``, a
``BaseException``, so an ``except Exception`` lets it through and whatever was under way (a load,
a batch) is never finished. The load and call paths catch ``BaseException`` and pass it through
``model_failure``: a panic fails that load or that batch; only ``STOPPING`` goes on up.
"""

from __future__ import annotations

import asyncio

import grpc

from udfserve.log_text import error_line

STOPPING = (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError)
"""The ``BaseException``s that end a thread, a task or the process: never taken for a model's
failure, so Ctrl-C, ``sys.exit`` and cancellation still stop what they mean to stop."""


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


class ModelAborted(BackendFault):
    """The model's own code aborted on a batch that passed validation, with an exception that is
    not an ``Exception``: a panic of its tokenizer or framework (``PanicException``).

    FAILED_PRECONDITION rather than INTERNAL: the fault is the model's as it is in the
    repository (a tokenizer.json whose regex cannot run on this text, say), not the server's,
    and the same input aborts it again on any server and in the CPU fallback, so a client fails
    the task with the message rather than retrying elsewhere. The model keeps serving other input.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION


class ModelCallTimeout(BackendFault):
    """The model's call ran past the server's bound on one call (``model_call_timeout_s``) and was
    stopped (``call_bound``). DEADLINE_EXCEEDED: the model is not broken and the same input may
    finish on a server with a longer bound; the message names the model, the rows and the bound."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the model and the file."""


class BackendNotInstalled(ModelLoadError):
    """The backend a model needs is not installed in this process's environment; the message
    names the model, the backend and the extra that installs it. The server serves its other
    models."""


def raise_if_stopping(error: BaseException) -> None:
    """Raise ``error`` again when it is one of ``STOPPING``: a caller that catches
    ``BaseException`` to fail one load or one batch lets these end what runs."""
    if isinstance(error, STOPPING):
        raise error


def model_failure(error: BaseException, model: str) -> Exception:
    """What a call of ``model`` that raised ``error`` fails with: ``error`` itself when it is an
    ``Exception``; for any other ``BaseException`` (a panic, which no ``except Exception``
    catches) a ``ModelAborted`` naming the model and the error. ``STOPPING`` is raised again."""
    if isinstance(error, Exception):
        return error
    raise_if_stopping(error)
    return ModelAborted(
        f"model {model!r} aborted on this input: {error_line(error)}; its own code (a tokenizer or "
        "framework) panicked and would again on any server: the model has to be fixed for this input"
    )
