"""The driver's side of a lease (``node_servers``): a small HTTP endpoint the nodes ask.

The process that entered ``node_servers`` (the driver; under Spark Connect, the client) serves
``GET /udfserve/lease/<lease id>`` on a thread of its own: ``200 held`` while the context is
open, ``410`` once it has ended. Every node holding the lease asks at each of its polls, so a
driver that dies, however it dies, stops answering with it (its port refuses, or its host is
gone) and the nodes drop the lease after their ``--lease-timeout-s``. At the context's end the
endpoint answers 410 until every node that asked before has asked again (or a bound passes):
those nodes stop at once instead of after the timeout. Nothing is served but the lease's state.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from udfserve.node_leases import Lease, holder_answer

logger = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    holder: LeaseHolder


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        holder = self.server.holder
        parts = urlsplit(self.path)
        if parts.path != holder.lease.path:
            self._answer(404, b'{"error": "no such lease"}')
            return
        query = parse_qs(parts.query)
        node, pid = query.get("node", [""])[0][:200], query.get("pid", [""])[0][:20]
        held = holder.asked((node, pid) if node and pid else None)
        self._answer(200 if held else 410, holder_answer(holder.lease.lease_id, held))

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("lease endpoint: %s", format % args)


class LeaseHolder:
    """One lease, served on ``bind_host:port`` (0: a free port) and advertised as ``host``."""

    def __init__(
        self, host: str, bind_host: str, port: int = 0, application: str = "", app_name: str = ""
    ) -> None:
        server_class = _IPv6Server if ":" in bind_host else _Server
        try:
            self._server = server_class((bind_host, port), _Handler)
        except OSError as exc:
            raise OSError(
                f"cannot serve the node lease on {bind_host}:{port}: {exc}; give node_servers a lease_host "
                "(and lease_port) of this machine that the executors can reach"
            ) from None
        self._server.holder = self
        self.lease = Lease(
            lease_id=secrets.token_hex(16),
            holder_host=host,
            holder_port=self._server.server_address[1],
            application=application,
            app_name=app_name,
        )
        self._condition = threading.Condition()
        self._released_at: float | None = None
        self._asked_before: set[tuple[str, str]] = set()
        self._asked_after: set[tuple[str, str]] = set()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="udfserve-node-lease", daemon=True
        )
        self._thread.start()

    def asked(self, asker: tuple[str, str] | None) -> bool:
        """Record which node asked (None: a task, before it starts a node); whether the lease is
        still held."""
        with self._condition:
            if self._released_at is None:
                if asker is not None:
                    self._asked_before.add(asker)
                return True
            if asker is not None:
                self._asked_after.add(asker)
            self._condition.notify_all()
            return False

    def askers(self) -> set[tuple[str, str]]:
        """The nodes (name, supervisor pid) that asked while the lease was held."""
        with self._condition:
            return set(self._asked_before)

    def release(self, wait_s: float) -> set[tuple[str, str]]:
        """Answer 410 from now on; wait up to ``wait_s`` for every node that asked before to ask
        again (it then stops unless another lease holds it), and stop serving. The nodes that did
        not ask again in time (they drop the lease after their ``--lease-timeout-s``)."""
        deadline = time.monotonic() + wait_s
        with self._condition:
            if self._released_at is None:
                self._released_at = time.monotonic()
            while not self._asked_before <= self._asked_after:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._condition.wait(left)
            missing = self._asked_before - self._asked_after
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        return missing
