"""The handlers of the KServe v2 protocol over HTTP, each answered by the gRPC front end's servicer.

Every route but inference calls the ``KServeServicer`` method of the same name as the gRPC front
end does (on the serving loop, through ``dispatch``), with a small stand-in for gRPC's servicer
context, and writes its answer as Triton writes it in JSON (``json_views``); a refusal is the
servicer's status as HTTP's (``json_views.HTTP_STATUS_OF``) with ``{"error": message}``. So the two
protocols answer the same words. Inference reads the body (``bodies``) and goes through the same
servicer to the model's batcher.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.core.job_context import JobContext, parse_job_context
from udfserve.services.model_server.frontends.admin_server import SERVING_LOOP_TIMEOUT_S
from udfserve.services.model_server.frontends.kserve.answers import DecodedHead, Failure, TensorAnswer
from udfserve.services.model_server.frontends.kserve.servicer import KServeServicer
from udfserve.services.model_server.frontends.kserve_http.answer_bodies import HttpAnswers, answer_body
from udfserve.services.model_server.frontends.kserve_http.bodies import InferBody, OutputFormat, read_request
from udfserve.services.model_server.frontends.kserve_http.bounds import (
    THREAD_FROM_BYTES,
    PortBounds,
    error_body,
)
from udfserve.services.model_server.frontends.kserve_http.dispatch import ServingCalls
from udfserve.services.model_server.frontends.kserve_http.json_views import as_json, http_status

logger = logging.getLogger(__name__)

INFERENCE_HEADER = "inference-header-content-length"

T = TypeVar("T")


class Aborted(Exception):
    """A servicer call that ended with a status (``context.abort``)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Context:
    """What the servicer's unary handlers use of ``grpc.aio.ServicerContext``."""

    def __init__(self, job_headers: list[tuple[str, str]]) -> None:
        self._metadata = tuple(job_headers)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status, headers, media_type="application/json")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message), status, headers, media_type="application/json")


class KServeHandlers:
    """The handlers of one port."""

    def __init__(self, servicer: KServeServicer, serving: ServingCalls, bounds: PortBounds) -> None:
        self._servicer = servicer
        self._serving = serving
        self._bounds = bounds

    async def _ask(self, method: str, message: Any, request: Request, timeout_s: float | None = None) -> Any:
        """The servicer's answer to ``method`` (on the serving loop); raises ``_Aborted``."""
        context = _Context(_job_headers(request))
        handler: Callable[[Any, Any], Coroutine[Any, Any, Any]] = getattr(self._servicer, method)
        return await self._serving.call(lambda: handler(message, context), timeout_s)

    # -- health and metadata -------------------------------------------------------------------
    async def server_metadata(self, request: Request) -> Response:
        answer = await self._ask("ServerMetadata", kpb.ServerMetadataRequest(), request)
        return json_response(as_json(answer))

    async def live(self, request: Request) -> Response:
        """200 while the serving loop runs; 503 when it has not answered within 3 s."""
        answer = await self._ask("ServerLive", kpb.ServerLiveRequest(), request, SERVING_LOOP_TIMEOUT_S)
        return _boolean(answer.live)

    async def ready(self, request: Request) -> Response:
        """200 once the server is ready (the gRPC ``ServerReady``), else 400, as Triton answers."""
        answer = await self._ask("ServerReady", kpb.ServerReadyRequest(), request, SERVING_LOOP_TIMEOUT_S)
        return _boolean(answer.ready)

    async def model_ready(self, request: Request) -> Response:
        model, version = _model(request)
        answer = await self._ask("ModelReady", kpb.ModelReadyRequest(name=model, version=version), request)
        return _boolean(answer.ready)

    async def model_metadata(self, request: Request) -> Response:
        model, version = _model(request)
        message = kpb.ModelMetadataRequest(name=model, version=version)
        return json_response(as_json(await self._ask("ModelMetadata", message, request)))

    async def model_config(self, request: Request) -> Response:
        """The configuration itself, as Triton answers it (not inside a ``config`` field)."""
        model, version = _model(request)
        message = kpb.ModelConfigRequest(name=model, version=version)
        return json_response(as_json((await self._ask("ModelConfig", message, request)).config))

    async def statistics(self, request: Request) -> Response:
        model, version = _model(request)
        message = kpb.ModelStatisticsRequest(name=model, version=version)
        return json_response(as_json(await self._ask("ModelStatistics", message, request)))

    # -- model repository ----------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        """A JSON list of the models, a line per version, as Triton answers it."""
        body = await self._json_body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(f"'ready' is {clip(ready, 40)}; expected true or false")
        answer = await self._ask("RepositoryIndex", kpb.RepositoryIndexRequest(ready=ready), request)
        return json_response(as_json(answer)["models"])

    async def repository_load(self, request: Request) -> Response:
        message = kpb.RepositoryModelLoadRequest(model_name=request.path_params["model"])
        _repository_parameters(message.parameters, await self._json_body(request))
        await self._ask("RepositoryModelLoad", message, request)
        return Response(status_code=200)

    async def repository_unload(self, request: Request) -> Response:
        message = kpb.RepositoryModelUnloadRequest(model_name=request.path_params["model"])
        _repository_parameters(message.parameters, await self._json_body(request))
        await self._ask("RepositoryModelUnload", message, request)
        return Response(status_code=200)

    async def json_body(self, request: Request) -> dict[str, Any]:
        """The request's body as a JSON object (``{}`` for none), read within the port's bounds."""
        return await self._json_body(request)

    async def _json_body(self, request: Request) -> dict[str, Any]:
        async with self._bounds.body(request) as body:
            if not body.strip():
                return {}
            try:
                value = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise InvalidInput(
                    f"the request body is not JSON ({clip(str(exc), 200)}); expected an object"
                ) from None
        if not isinstance(value, dict):
            raise InvalidInput(f"the request body is JSON {type(value).__name__}; expected an object")
        return value

    # -- inference -----------------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        """Read, start on the serving loop, answer. A body or an answer of ``THREAD_FROM_BYTES`` or
        more is read or written on a worker thread: the JSON of a large tensor takes the interpreter
        for long, and the loop the port runs on (the serving loop, by default) must keep its turns;
        the worker lets go of the GIL every few milliseconds, the loop's own code would not."""
        model, version = _model(request)
        job = parse_job_context(_job_headers(request))
        header = request.headers.get(INFERENCE_HEADER)
        async with self._bounds.body(request) as body:
            try:
                read, front_end, start = await _aside_if(
                    len(body) >= THREAD_FROM_BYTES, lambda: self._prepare(body, header, model, version, job)
                )
            except InvalidInput as exc:
                return await self._refused(model, version, job, exc)
            answer = await self._serving.infer(start)
        if isinstance(answer, Failure):
            return error_response(http_status(answer.code), answer.message)
        assert isinstance(answer, TensorAnswer)
        size = sum(raw.nbytes if isinstance(raw, np.ndarray) else len(raw) for *_, raw in answer.tensors)
        content, json_length = await _aside_if(
            size >= THREAD_FROM_BYTES, lambda: answer_body(answer, read.form, front_end.texts)
        )
        headers = {}
        if json_length is not None:
            headers["Inference-Header-Content-Length"] = str(json_length)
        encoding = _accepted_encoding(request.headers.get("accept-encoding", ""))
        if encoding is not None:
            content = await _compressed(content, encoding)
            headers["Content-Encoding"] = encoding
        media_type = "application/json" if json_length is None else "application/octet-stream"
        return Response(content, 200, headers, media_type=media_type)

    def _prepare(
        self, body: bytes, header: str | None, model: str, version: str, job: JobContext
    ) -> tuple[InferBody, HttpAnswers, Callable[[], Any]]:
        """The request read, who answers it, and what starts it on the serving loop."""
        read = read_request(body, header, model, version)
        front_end = HttpAnswers(read.form, self._servicer.shared_memory)
        return read, front_end, self._starter(read, job, front_end)

    def _starter(self, read: InferBody, job: JobContext, front_end: HttpAnswers) -> Callable[[], Any]:
        """What starts the request on the serving loop: the arrays over the body when every input is
        binary (``start_decoded``), else the request as the gRPC message, built here first."""
        servicer = self._servicer
        decoded = read.decoded
        if decoded is not None:

            def start_decoded() -> Any:
                outcome = servicer.start_decoded(read.head, decoded, read.output_names, job, front_end)
                if outcome is None:  # not the common request: the message's checks say why
                    return servicer.start_answered_by(read.message(), job, front_end)
                return outcome

            return start_decoded
        try:
            message = read.message()
        except InvalidInput as exc:
            failure = exc
            return lambda: servicer.refuse(read.head, job, failure, front_end)
        return lambda: servicer.start_answered_by(message, job, front_end)

    async def _refused(self, model: str, version: str, job: JobContext, exc: InvalidInput) -> Response:
        """A body that is not an inference request, counted as a refused request of ``model``."""
        head = DecodedHead("", model, version)
        failure = await self._serving.infer(
            lambda: self._servicer.refuse(head, job, exc, HttpAnswers(_NO_FORM))
        )
        assert isinstance(failure, Failure)
        return error_response(http_status(failure.code), failure.message)


_NO_FORM = OutputFormat()


def _model(request: Request) -> tuple[str, str]:
    params = request.path_params
    return params.get("model", ""), params.get("version", "")


def _job_headers(request: Request) -> list[tuple[str, str]]:
    """The request's headers as the gRPC metadata they stand for (Spark job context keys)."""
    return list(request.headers.items())


def _boolean(value: bool) -> Response:
    return Response(status_code=200 if value else 400)


def _repository_parameters(parameters: Any, body: dict[str, Any]) -> None:
    """The ``parameters`` object of a load or unload body into the gRPC request's map."""
    given = body.get("parameters", {})
    if not isinstance(given, dict):
        raise InvalidInput(f"'parameters' is {type(given).__name__}; expected an object")
    for key, value in given.items():
        parameter = parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
            parameter.int64_param = value
        elif isinstance(value, str):
            parameter.string_param = value
        else:
            raise InvalidInput(
                f"parameter {clip(key, 80)!r} is {clip(value, 40)}; expected a string, a boolean or an "
                "integer"
            )


def _accepted_encoding(accept: str) -> str | None:
    """gzip or deflate when the client accepts it (and does not refuse it with q=0), else None."""
    accepted = {}
    for item in accept.lower().split(","):
        name, _, params = item.strip().partition(";")
        quality = params.strip().removeprefix("q=")
        accepted[name.strip()] = quality not in ("0", "0.0", "0.00", "0.000")
    for encoding in ("gzip", "deflate"):
        if accepted.get(encoding):
            return encoding
    return None


async def _aside_if(large: bool, work: Callable[[], T]) -> T:
    """``work()`` on a worker thread when ``large``, else here."""
    if large:
        return await asyncio.to_thread(work)
    return work()


async def _compressed(content: bytes, encoding: str) -> bytes:
    def compress() -> bytes:
        if encoding == "gzip":
            return gzip.compress(content, compresslevel=1)
        return zlib.compress(content, 1)

    return await _aside_if(len(content) >= THREAD_FROM_BYTES, compress)
