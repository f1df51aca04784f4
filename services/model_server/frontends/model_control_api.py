"""The load, unload and index calls (``--model-control explicit``), as both protocols serve them.

``ControlCalls`` runs ``core.model_control``'s calls for a front end: a call runs to its end even
when its caller goes away (a load cut short would leave a version half loaded, an unload half
drained), and a config given as JSON text is read here, within bounds, so that text that is not
JSON, not an object, too large or too deep is INVALID_ARGUMENT naming what was wrong, never a
fault of the server. The udfserve protocol's calls (``LoadModel``, ``UnloadModel``,
``RepositoryIndex`` of ``udfserve.v1.Inference``) are answered here too; the KServe repository
calls are ``kserve.repository``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any, NoReturn

import grpc

from udfserve.log_text import clip
from udfserve.protocol import inference_pb2 as pb
from udfserve.runtime.errors import InvalidInput, ServingError
from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.repository import parse_model_config
from udfserve.services.model_server.core.model_control import IndexEntry, ModelControl
from udfserve.services.model_server.core.model_table import ModelTable
from udfserve.services.model_server.errors import failure_status

logger = logging.getLogger(__name__)

MAX_CONFIG_JSON_BYTES = 64 * 1024
"""The largest config a load call may give: a config.yaml's fields are a few hundred bytes; the
bound keeps a hostile call from costing the server more than that to parse and report."""

_STATE_TO_PROTO = {
    "READY": pb.VERSION_STATE_READY,
    "LOADING": pb.VERSION_STATE_LOADING,
    "UNLOADING": pb.VERSION_STATE_UNLOADING,
    "UNAVAILABLE": pb.VERSION_STATE_UNAVAILABLE,
}


def parse_config_json(text: str, model: str, where: str) -> ModelConfig:
    """The config a load call gives as JSON text (``where`` names the field that carried it), as
    a ``ModelConfig``; ``InvalidInput`` saying what is wrong and what was expected."""
    what = f"{where} of the load of model {clip(model, 80)!r}"
    expected = "expected a JSON object of the model's config.yaml fields"
    size = len(text.encode())
    if size > MAX_CONFIG_JSON_BYTES:
        raise InvalidInput(f"{what} holds {size} bytes; {expected}, at most {MAX_CONFIG_JSON_BYTES} bytes")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{what} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); {expected}"
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidInput(f"{what} is not usable JSON ({clip(str(exc), 200)}); {expected}") from None
    except RecursionError:
        raise InvalidInput(f"{what} nests deeper than the server reads; {expected}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} is a JSON {type(data).__name__}, not an object; {expected}")
    try:
        return parse_model_config(data, what)
    except ValueError as exc:
        fields = ", ".join(ModelConfig.model_fields)
        raise InvalidInput(
            f"{exc}; expected udfserve's config.yaml fields ({fields}) with valid values, not those of "
            "Triton's config.pbtxt"
        ) from None


class ControlCalls:
    """The model control calls of the front ends, over the server's ``ModelControl``."""

    def __init__(self, control: ModelControl, models: ModelTable) -> None:
        self._control = control
        self._models = models
        self._running: set[asyncio.Future[None]] = set()
        """Calls whose caller may have gone: kept until they end."""

    async def load(self, name: str, config: ModelConfig | None, *, reload: bool = False) -> list[int]:
        """Load ``name`` (see ``ModelControl.load``); the versions serving once it returns."""
        await self._to_the_end(self._control.load(name, config, reload=reload))
        return [served.version for served in self._models.served_versions(name)]

    async def unload(self, name: str) -> None:
        """Unload every version of ``name`` (see ``ModelControl.unload``)."""
        await self._to_the_end(self._control.unload(name))

    def index(self, ready_only: bool) -> list[IndexEntry]:
        """The repository index (see ``ModelControl.index``): answered in every mode."""
        return self._control.index(ready_only)

    async def _to_the_end(self, call: Coroutine[Any, Any, None]) -> None:
        """Await ``call``, which goes on when the caller is cancelled (its client left)."""
        task = asyncio.ensure_future(call)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_report_fault)  # nobody else will see how it ended
            raise


def _report_fault(task: asyncio.Future[None]) -> None:
    """Log a fault of a call whose caller left (a refusal went to nobody: nothing to log)."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None and not isinstance(exc, ServingError):
        logger.error("a model control call failed", exc_info=(type(exc), exc, exc.__traceback__))


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, what: str) -> NoReturn:
    code, text = failure_status(exc, what)
    await context.abort(code, text)
    raise AssertionError("context.abort returned")  # it raises


async def load_model(
    calls: ControlCalls, request: pb.LoadModelRequest, context: grpc.aio.ServicerContext
) -> pb.LoadModelResponse:
    """``LoadModel``: returns once the versions serve."""
    try:
        config = (
            parse_config_json(request.config_json, request.model, "config_json")
            if request.config_json
            else None
        )
        versions = await calls.load(request.model, config, reload=request.reload)
    except Exception as exc:
        await _abort(context, exc, f"the load of model '{clip(request.model)}'")
    return pb.LoadModelResponse(served_versions=versions)


async def unload_model(
    calls: ControlCalls, request: pb.UnloadModelRequest, context: grpc.aio.ServicerContext
) -> pb.UnloadModelResponse:
    """``UnloadModel``: returns once every version drained and was released."""
    try:
        await calls.unload(request.model)
    except Exception as exc:
        await _abort(context, exc, f"the unload of model '{clip(request.model)}'")
    return pb.UnloadModelResponse()


def repository_index(calls: ControlCalls, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
    """``RepositoryIndex``: every model of the repository and of the server, by version."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.Entry(
                model=entry.name,
                version=int(entry.version or 0),
                state=_STATE_TO_PROTO[entry.state],
                reason=entry.reason,
            )
            for entry in calls.index(request.ready_only)
        ]
    )
