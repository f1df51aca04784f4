"""uvicorn's h11 protocol with a lingering close after the 400 it sends for a request it cannot parse.

h11 refuses a request line or headers over 16 KiB (``h11_max_incomplete_event_size``), which is
what bounds them (``kserve_http.listener.HTTP_PARSER``). uvicorn then writes its 400 and closes at
once, while the client is usually still sending the rest of that request: the kernel answers
bytes that arrive at a closed socket, or lie unread in it, with a reset, and a reset can destroy
the 400 in the client's buffers before the client reads it. The client sees "connection reset"
instead of the status that says what was wrong.

The lingering close is what web servers do there (nginx's ``lingering_close``): after the 400,
stop writing (a FIN, where the transport can half-close), read and discard what still arrives for
at most ``LINGER_S`` seconds or ``LINGER_BYTES`` bytes, then close. Both bounds keep a client that
never stops sending from holding the connection: it counts against the port's connections as
any other until then.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

LINGER_S = 2.0
"""The longest a connection is kept open after its 400, reading and discarding."""
LINGER_BYTES = 1 << 20
"""The most a client may still send after its 400 before the connection is closed regardless."""


class LingeringH11Protocol(H11Protocol):
    """``H11Protocol`` whose 400 for an unparsable request is followed by a lingering close."""

    _discarded: int | None = None
    """Bytes read and dropped since the 400; None while the connection serves requests."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 (``H11Protocol.send_400_response``), ending in a lingering close."""
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=STATUS_PHRASES[400]),
            h11.Data(data=msg.encode("ascii")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self._linger()

    def _linger(self) -> None:
        transport = self.transport
        self._discarded = 0
        if transport.can_write_eof():  # TLS cannot half-close: it lingers without the FIN
            transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._discarded is None:
            super().data_received(data)
            return
        self._discarded += len(data)
        if self._discarded > LINGER_BYTES:
            self.transport.close()

    def eof_received(self) -> None:
        if self._discarded is not None:
            self.transport.close()  # the client has sent everything: the 400 is delivered
            return
        super().eof_received()
