"""What ``PredictStream`` and a protocol's ``Wire`` say to each other: the replies, the end of a
stream, a broken call, and which answer codes mean the request is wrong rather than the server."""

from __future__ import annotations

import logging
import queue
from dataclasses import dataclass
from typing import Protocol

import grpc
import pyarrow as pa

logger = logging.getLogger(__name__)

USER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
"""Answers that mean the request is wrong: the task fails with the server's message."""

AUTH_ERROR_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
"""Refusals of the client's credentials: a configuration error, never a reason to fall back."""


@dataclass
class Reply:
    """A server's answer to one batch, whatever the protocol: a result, or an error with its code."""

    batch_id: int
    result: pa.RecordBatch | None = None
    code: grpc.StatusCode | None = None
    message: str = ""
    unreadable: str = ""
    """Set when the answer could not be read: the reason (the stream fails, ``bad_answer``)."""
    resend: bool = False
    """The server computed nothing and will serve the same batch sent another way: send it again."""
    version: int = 0
    """The model version that computed ``result`` (0: the server did not say)."""


class StreamBroken(Exception):
    """The call itself ended with a status (the connection reset, the server killed)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


CLIENT_TOO_LARGE_TEXT = "Sent message larger than max"
"""How gRPC words its refusal to send a message over ``grpc.max_send_message_length``."""


class Wire(Protocol):
    """How one protocol carries a partition's batches; ``PredictStream`` does the rest.

    ``open`` starts the call; from then on the wire puts ``Reply``, ``StreamBroken`` or ``END``
    (the server closed a stream normally) into ``events``, from any thread. ``send`` encodes the
    batch when it is sent, so that only the Arrow batch is held while it waits for its answer.
    """

    def open(self, events: queue.Queue[object]) -> None: ...

    def send(self, batch_id: int, batch: pa.RecordBatch) -> bool:
        """Send ``batch`` as ``batch_id``; True when its payload went through the node's shared
        memory, False when inline in the message."""
        ...

    def finish(self) -> bool:
        """No more batches: end the call; True when it ended cleanly."""
        ...

    def cancel(self) -> None: ...


END = object()
