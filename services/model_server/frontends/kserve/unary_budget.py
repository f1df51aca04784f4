"""The bytes that unary ``ModelInfer`` calls hold, bounded over the whole server.

gRPC reads a unary call's whole message before its handler runs, and a stream's bound
(``streaming.StreamBounds``) does not cover calls: without this budget, many concurrent calls of
large messages would each keep their message (and its decoded inputs) until the batcher answered
them. A call whose message would take the held bytes past the budget is refused at once,
RESOURCE_EXHAUSTED, and its message freed; a call is always admitted while none is held, so one
message up to the message limit passes whatever the budget says.
"""

from __future__ import annotations

import logging

from services.model_server.errors import ServerOverloaded
from services.model_server.observability.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class UnaryBudget:
    """Bytes of unary calls read and not yet answered, and the most the server holds."""

    def __init__(self, limit_bytes: int, metrics: ServerMetrics) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the unary budget must be at least 1 byte, received {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._gauge = metrics.unary_held_bytes
        self._refused = metrics.calls_refused.labels(bound="max_unary_held_bytes")

    def take(self, size_bytes: int) -> None:
        """Hold ``size_bytes`` for one call; raises ``ServerOverloaded`` (RESOURCE_EXHAUSTED) when
        they do not fit. Pair with ``give_back`` once the call is answered."""
        if self.held_bytes and self.held_bytes + size_bytes > self.limit_bytes:
            self._refused.inc()
            raise ServerOverloaded(
                f"the server holds {self.held_bytes} bytes of unary calls not yet answered; this "
                f"call's {size_bytes} bytes would pass its limit of {self.limit_bytes} "
                "(--max-unary-held-bytes): retry later, or send fewer calls at once"
            )
        self.held_bytes += size_bytes
        self._gauge.set(self.held_bytes)

    def give_back(self, size_bytes: int) -> None:
        """A call taken with ``take`` was answered (or abandoned by its client)."""
        self.held_bytes -= size_bytes
        self._gauge.set(self.held_bytes)
