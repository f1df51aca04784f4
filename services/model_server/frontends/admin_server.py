"""The HTTP admin app on a thread of its own, with its own event loop.

The serving loop carries every prediction; anything that runs on it delays them all. So the admin
app (uvicorn and FastAPI) runs on a separate thread and loop: parsing HTTP, rendering ``/metrics``
(prometheus_client's registry is thread-safe) and answering probes never take turns of the
serving loop. They still share the GIL, which the interpreter hands over every few milliseconds
(``sys.getswitchinterval()``, 5 ms), so a render never stalls the serving loop for longer than
that; how much of the GIL the admin app takes in total is bounded by ``admin_limits`` and the
render pace of ``metrics_page``.

What the routes read of the objects the serving loop owns (the model table, the Spark
applications) they read on that loop, through ``ServingLoop.call``: nothing mutable is shared
between the threads, and a serving loop that no longer answers shows as 503 on the admin app.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import uvicorn

from udfserve.services.model_server.frontends.admin_limits import ADMIN_MAX_CONNECTIONS
from udfserve.services.model_server.frontends.lingering_http import LingeringH11Protocol

T = TypeVar("T")

logger = logging.getLogger(__name__)

SERVING_LOOP_TIMEOUT_S = 3.0
"""How long an admin route waits for the serving loop before answering 503."""

STOP_TIMEOUT_S = 5.0
"""How long stopping waits for the admin thread to close its connections."""


class ServingLoopUnresponsive(Exception):
    """The serving loop did not run an admin route's read within ``SERVING_LOOP_TIMEOUT_S``."""


class ServingLoop:
    """Runs short reads on the serving loop for the admin thread, and hands their result back."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def call(self, read: Callable[[], T], timeout_s: float = SERVING_LOOP_TIMEOUT_S) -> T:
        """``read()`` run on the serving loop; raises ``ServingLoopUnresponsive`` when it has not
        run within ``timeout_s`` (then it never will) or the loop is closed."""
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not result.set_running_or_notify_cancel():
                return  # the admin route gave up waiting
            try:
                result.set_result(read())
            except BaseException as exc:  # handed to the admin thread, raised there
                result.set_exception(exc)

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the serving loop is closed
            raise ServingLoopUnresponsive("the serving loop has stopped") from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(result), timeout_s)
        except TimeoutError:
            raise ServingLoopUnresponsive(
                f"the serving loop did not answer within {timeout_s:g} s (it is blocked or overloaded)"
            ) from None


class UvicornWithoutSignals(uvicorn.Server):
    """uvicorn installs its own SIGINT/SIGTERM handlers; this process drains through the serving
    loop's, and a thread other than the main one cannot install any."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AdminThread:
    """uvicorn serving ``app`` on ``http_socket`` in a daemon thread named ``udfserve-admin``."""

    def __init__(self, app: Any, http_socket: socket.socket, tls: dict[str, object]) -> None:
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # uvicorn's lines go through the process's handler and its bounds
            access_log=False,
            lifespan="off",
            limit_concurrency=ADMIN_MAX_CONNECTIONS,
            # h11 bounds a request's line and headers, and its 400 for one over that bound is followed
            # by a lingering close (see kserve_http.listener.HTTP_PARSER)
            http=LingeringH11Protocol,
            # the client address is the peer's: an X-Forwarded-For header must not choose the
            # bucket a request is counted in
            proxy_headers=False,
            timeout_graceful_shutdown=int(STOP_TIMEOUT_S) // 2,
            **tls,  # type: ignore[arg-type]
        )
        self._server = UvicornWithoutSignals(config)
        self._socket = http_socket
        self._thread = threading.Thread(target=self._run, name="udfserve-admin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._socket]))
        except Exception:
            logger.exception("the HTTP admin app stopped on an error; gRPC serving goes on")
        finally:
            loop.close()

    async def stop(self) -> None:
        """Close the admin app's connections and wait (bounded) for its thread to end."""
        self._server.should_exit = True  # uvicorn polls it every 0.1 s
        await asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("the HTTP admin app did not stop within %g s; exiting without it", STOP_TIMEOUT_S)
