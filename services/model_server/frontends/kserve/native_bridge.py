"""KServe v2 through the native front end (``--kserve-frontend native``), on its own port, its own
unix socket (``--kserve-socket``), or both.

The compiled module (``native/kserve_frontend.cpp``) receives the calls with grpc++ and decodes
the common ModelInfer request outside the GIL. This module takes, in one turn of the event loop,
every call it queued since the last turn (an eventfd says when there are some) and answers them
with the same ``KServeServicer`` as the Python front end:

- a decoded ModelInfer goes through ``start_decoded`` to the model's dynamic batcher, the same
  one Arrow requests and the Python front end's requests join, and its outputs go back as arrays
  that the module encodes without the GIL; what is not the common request (BYTES tensors, typed
  contents, parameters, a datatype to coerce, a wrong shape) is answered from its message by
  ``start``, with the Python front end's checks and messages;
- every other unary method (health, metadata, config, statistics, the model repository calls,
  the system shared-memory calls) calls the servicer's own handler with a small stand-in for
  gRPC's servicer context, which names the client as the module's peer (gRPC's own string), so a
  client's regions count against its bounds alike on both ports;
- system shared memory is the servicer's: one table of regions for the server, so a region
  registered through either port (or over HTTP) is used and unregistered through any; a request
  naming regions carries tensor or output parameters, so the module hands it to ``start``, which
  reads its inputs from them and whose answer writes its outputs there; CUDA shared memory stays
  refused, by the same handlers as on the main port;
- ModelStreamInfer is refused (UNIMPLEMENTED) by the module, naming the main port, where it is
  served.

Metrics, statistics, in-flight accounting and draining are the servicer's, as for the Python
front end. The module itself applies the port's bounds before it reads a call's message: the
token (every call must carry it, as on the main port), ``--max-concurrent-calls`` (calls of this
port handled at once) and ``--max-unary-held-bytes`` (bytes of this port's calls read or being
read and not yet answered); see ``native/kserve_frontend.cpp``. It also trims the heap after
large calls (``--trim-after-call-bytes``), as ``core/memory_trim.py`` does for the main port.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.services.model_server.core.job_context import parse_job_context
from udfserve.services.model_server.core.pending import Pending
from udfserve.services.model_server.frontends.kserve.answers import DecodedHead, Failure, TensorAnswer
from udfserve.services.model_server.frontends.kserve.native import BUILD_COMMAND, load_frontend_module
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer
from udfserve.services.model_server.unix_socket import listen_on_unix_socket

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER = f"/{SERVICE}/ModelInfer"
UNREADABLE = "the request cannot be parsed as inference.{}; expected a serialized message of that type"

FastCall = tuple[int, str, str, str, list[Any], list[str], list[tuple[str, str]]]
"""A decoded ModelInfer: call id, model, version, request id, inputs as (name, datatype, shape,
array), requested output names, metadata."""
SlowCall = tuple[int, str, bytes, list[tuple[str, str]]]
"""Any other call: call id, method, the serialized request, metadata."""


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Context:
    """What the servicer's unary handlers use of ``grpc.aio.ServicerContext``."""

    def __init__(self, metadata: Sequence[tuple[str, str]], peer: str) -> None:
        self._metadata = tuple(metadata)
        self._peer = peer
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        """The client, as gRPC names it (``ipv4:10.0.0.3:52011``): what shared memory is bounded by."""
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Abort(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


def _request_classes() -> dict[str, tuple[str, Callable[[bytes], Any]]]:
    """Each unary method of the service: its handler's name and its request's parser."""
    service = kpb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    classes = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            continue
        message_class = message_factory.GetMessageClass(method.input_type)
        classes[f"/{SERVICE}/{method.name}"] = (method.name, message_class.FromString)
    return classes


class NativeKServeFrontend:
    """The native front end of one server: started on its event loop, stopped when it drains."""

    def __init__(
        self,
        servicer: KServeServicer,
        address: str | None,
        max_message_bytes: int,
        auth_token: str | None = None,
        tls_key: bytes = b"",
        tls_cert: bytes = b"",
        tls_client_ca: bytes = b"",
        *,
        max_concurrent_calls: int,
        max_held_bytes: int,
        trim_after_call_bytes: int = 0,
        socket: Path | None = None,
        socket_mode: int = 0o600,
    ) -> None:
        """Listen on ``address`` (host:port), on the unix socket ``socket`` (local, so plaintext and
        protected by its ``socket_mode``, as the server's main socket; the token is checked on it
        too), or on both, with one set of bounds for the calls of both."""
        if address is None and socket is None:
            raise ValueError(
                "the native KServe front end needs an address (host:port), a unix socket, or both"
            )
        self._servicer = servicer
        self._address = address
        self._socket = socket
        self._socket_mode = socket_mode
        self._max_message_bytes = max_message_bytes
        self._token = auth_token
        self._max_concurrent_calls = max_concurrent_calls
        self._max_held_bytes = max_held_bytes
        self._trim_after_call_bytes = trim_after_call_bytes
        self._tls = (tls_key.decode(), tls_cert.decode(), tls_client_ca.decode())
        self._methods = _request_classes()
        self._frontend: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        """Calls whose answer waits for the batcher (or a handler task), by call id."""
        self._cancelled: set[int] = set()
        """Of them, those whose client went away: answered CANCELLED once their work is dropped."""

    @property
    def port(self) -> int | None:
        """The bound TCP port; None without an address (a unix socket only)."""
        assert self._frontend is not None, "not started"
        return None if self._address is None else int(self._frontend.port)

    def bounds(self) -> tuple[int, int, int]:
        """(calls of the port handled now, bytes its read budget holds, calls waiting unread for
        room in it); zeros before the start."""
        if self._frontend is None:
            return 0, 0, 0
        calls, held_bytes, waiting, _trims = self._frontend.bounds()
        return int(calls), int(held_bytes), int(waiting)

    def start(self) -> int | None:
        """Listen (raising ``OSError`` when the address or the socket cannot be had); the bound port,
        None without an address. The socket follows the main socket's rules (``unix_socket.py``)."""
        if self._socket is None:
            self._open("")
        else:
            listen_on_unix_socket(self._socket, self._socket_mode, self._open, "--kserve-socket")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._frontend.wakeup_fd, self._on_calls)
        return self.port

    def _open(self, unix_target: str) -> None:
        """Start the module's server on the address and ``unix_target`` (``unix:<path>``; "" for none)."""
        module = load_frontend_module()
        key, cert, client_ca = self._tls
        # given only with a socket: a module built before sockets then still serves its port
        socket_argument = {"unix_address": unix_target} if unix_target else {}
        try:
            self._frontend = module.Frontend(
                self._address or "",
                self._max_message_bytes,
                key,
                cert,
                client_ca,
                auth_token=self._token or "",
                max_concurrent_calls=self._max_concurrent_calls,
                max_held_bytes=self._max_held_bytes,
                trim_after_call_bytes=self._trim_after_call_bytes,
                **socket_argument,
            )
        except RuntimeError as exc:
            raise OSError(f"native KServe front end: {exc}") from exc
        except TypeError as exc:  # pybind11's answer to an argument the built module does not take
            raise OSError(
                f"native KServe front end: the built module predates --kserve-socket ({exc}); rebuild it: "
                f"{BUILD_COMMAND}"
            ) from exc

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, give those accepted ``grace_s`` to be answered, then stop listening."""
        frontend = self._frontend
        if frontend is None:
            return
        frontend.stop_accepting()
        deadline = time.monotonic() + grace_s
        while frontend.unanswered() and time.monotonic() < deadline:
            self._on_calls()  # calls queued before stop_accepting are still answered
            await asyncio.sleep(0.01)
        if self._loop is not None:  # None: listening failed half-way (the socket's mode or rename)
            self._loop.remove_reader(frontend.wakeup_fd)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(frontend.stop)

    # -- calls -----------------------------------------------------------------------------------

    def _on_calls(self) -> None:
        fast, slow, cancelled = self._frontend.take()
        for call in fast:
            self._guarded(self._answer_decoded, call)
        for call in slow:
            self._guarded(self._answer_message, call)
        for call_id in cancelled:
            work = self._pending.get(call_id)
            if work is not None:  # else answered already, or answered at once
                self._cancelled.add(call_id)
                work.cancel()

    def _guarded(self, answer: Callable[[Any], None], call: Any) -> None:
        """Answer one call; a failure of this code fails that call alone, never the others."""
        try:
            answer(call)
        except Exception:
            logger.exception("native KServe front end: answering call %s failed", call[0])
            self._fail(call[0], grpc.StatusCode.INTERNAL, "the server failed to answer; see its log")

    def _answer_decoded(self, call: FastCall) -> None:
        call_id, model, version, request_id, tensors, output_names, metadata = call
        head = DecodedHead(request_id, model, version)
        outcome = self._servicer.start_decoded(head, tensors, output_names, parse_job_context(metadata))
        if outcome is None:  # not the common request: the message's checks say why, or coerce it
            self._answer_message((call_id, MODEL_INFER, self._frontend.request_bytes(call_id), metadata))
            return
        self._answer_outcome(call_id, outcome)

    def _answer_outcome(self, call_id: int, outcome: Any) -> None:
        if isinstance(outcome, Pending):
            self._pending[call_id] = outcome.future
            outcome.future.add_done_callback(functools.partial(self._finished, call_id, outcome.finish))
        else:
            self._send(call_id, outcome)

    def _answer_message(self, call: SlowCall) -> None:
        call_id, method, payload, metadata = call
        if method == MODEL_INFER:
            try:
                request = kpb.ModelInferRequest.FromString(payload)
            except DecodeError:
                self._fail(call_id, grpc.StatusCode.INVALID_ARGUMENT, UNREADABLE.format("ModelInferRequest"))
                return
            self._answer_outcome(call_id, self._servicer.start(request, parse_job_context(metadata)))
            return
        handler = self._methods.get(method)
        if handler is None:
            self._fail(call_id, grpc.StatusCode.UNIMPLEMENTED, f"method {method} is not served here")
            return
        assert self._loop is not None
        context = _Context(metadata, self._frontend.peer(call_id))
        task = self._loop.create_task(self._unary(call_id, handler, payload, context))
        self._tasks.add(task)
        self._pending[call_id] = task
        task.add_done_callback(functools.partial(self._task_done, call_id))

    def _task_done(self, call_id: int, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._pending.pop(call_id, None)
        self._cancelled.discard(call_id)

    async def _unary(
        self,
        call_id: int,
        handler: tuple[str, Callable[[bytes], Any]],
        payload: bytes,
        context: _Context,
    ) -> None:
        name, parse = handler
        try:
            message = parse(payload)
        except DecodeError:
            self._fail(call_id, grpc.StatusCode.INVALID_ARGUMENT, UNREADABLE.format(f"{name}Request"))
            return
        try:
            response = await getattr(self._servicer, name)(message, context)
        except _Abort as exc:
            self._fail(call_id, exc.code, exc.message)
            return
        except NotImplementedError:
            # a method udfserve does not serve (trace, log settings):
            # the generated base class's handler sets UNIMPLEMENTED on the context, then raises
            code = context.code or grpc.StatusCode.UNIMPLEMENTED
            self._fail(call_id, code, context.details or "not served")
            return
        except asyncio.CancelledError:
            self._fail(call_id, *self._cancellation(call_id))
            raise
        except Exception:
            logger.exception("native KServe front end: %s failed", name)
            self._fail(call_id, grpc.StatusCode.INTERNAL, f"{name} failed; see the server log")
            return
        self._frontend.answer_bytes(call_id, response.SerializeToString())

    def _cancellation(self, call_id: int) -> tuple[grpc.StatusCode, str]:
        """How to answer a call whose work was cancelled: its client left, or the server stops."""
        if call_id in self._cancelled:
            return grpc.StatusCode.CANCELLED, "cancelled by the client"
        return grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry on another"

    def _finished(self, call_id: int, finish: Callable[[Any], Any], future: asyncio.Future[Any]) -> None:
        self._pending.pop(call_id, None)
        try:
            answer = finish(future)
        except asyncio.CancelledError:  # its client left (the batcher dropped it), or the server stops
            self._fail(call_id, *self._cancellation(call_id))
            self._cancelled.discard(call_id)
            return
        self._cancelled.discard(call_id)
        self._send(call_id, answer)

    def _send(self, call_id: int, answer: Any) -> None:
        try:
            if isinstance(answer, Failure):
                self._fail(call_id, answer.code, answer.message)
            elif isinstance(answer, TensorAnswer):
                tensors = answer.tensors
                self._frontend.answer(call_id, answer.model_name, answer.model_version, answer.id, tensors)
            else:
                self._frontend.answer_bytes(call_id, answer.SerializeToString())
        except Exception:
            logger.exception("native KServe front end: sending the answer of call %s failed", call_id)
            self._fail(call_id, grpc.StatusCode.INTERNAL, "the server failed to send its answer; see its log")

    def _fail(self, call_id: int, code: grpc.StatusCode, message: str) -> None:
        with contextlib.suppress(Exception):
            self._frontend.fail(call_id, code.value[0], message)


class NativeBoundsCollector(Collector):
    """The native port's bounds on ``/metrics``, read from the module at each scrape."""

    def __init__(self, frontend: NativeKServeFrontend) -> None:
        self._frontend = frontend

    def collect(self) -> Iterator[GaugeMetricFamily]:
        calls, held_bytes, waiting = self._frontend.bounds()
        yield GaugeMetricFamily(
            "udfserve_native_kserve_calls",
            "Calls the native KServe port handles now (at most --max-concurrent-calls).",
            value=calls,
        )
        yield GaugeMetricFamily(
            "udfserve_native_kserve_held_bytes",
            "Bytes of the native KServe port's calls reserved for reading or read and not yet answered "
            "(at most --max-unary-held-bytes).",
            value=held_bytes,
        )
        yield GaugeMetricFamily(
            "udfserve_native_kserve_calls_waiting",
            "Native KServe calls waiting, unread, for room in --max-unary-held-bytes.",
            value=waiting,
        )
