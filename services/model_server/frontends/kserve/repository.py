"""The KServe (Triton) model repository calls, as tritonclient speaks them.

``RepositoryIndex``, ``RepositoryModelLoad`` and ``RepositoryModelUnload`` run the server's
model control calls (``--model-control explicit``; in another mode a load or unload is refused
FAILED_PRECONDITION, the index is answered in every mode). What differs from Triton, said in
the refusals:

- a load's ``config`` parameter (``load_model(name, config=...)``) is udfserve's config.yaml
  fields as a JSON object, not Triton's ``config.pbtxt`` as JSON;
- ``file:`` parameters, with which Triton takes a model's files from the caller, are refused
  INVALID_ARGUMENT: udfserve loads models only from its repository, which only its operator
  writes;
- a ``repository_name`` other than "" is refused INVALID_ARGUMENT: a server has one repository;
- ``unload_dependents`` (which tritonclient always sends) is accepted and changes nothing: no
  udfserve model depends on another.

Statuses are the server's own (``errors``): INVALID_ARGUMENT for a bad name or config,
NOT_FOUND for a model the repository (load) or the server (unload) does not hold,
FAILED_PRECONDITION for a version that failed to load or a server not in explicit mode,
RESOURCE_EXHAUSTED when too many calls wait.
"""

from __future__ import annotations

from collections.abc import Mapping

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.model_config import ModelConfig
from udfserve.services.model_server.frontends.model_control_api import ControlCalls, parse_config_json

CONFIG_PARAMETER = "config"
UNLOAD_DEPENDENTS_PARAMETER = "unload_dependents"
FILE_PARAMETER_PREFIX = "file:"


def check_repository_name(repository_name: str, call: str) -> None:
    """A server has one repository: only "" (the default) names it."""
    if repository_name:
        raise InvalidInput(
            f'{call}: repository_name {clip(repository_name, 80)!r} is not served; expected "" '
            "(this server has one repository, its --model-repository)"
        )


def index(calls: ControlCalls, request: kpb.RepositoryIndexRequest) -> kpb.RepositoryIndexResponse:
    """Every model of the repository and of the server, a line per version, in Triton's words."""
    check_repository_name(request.repository_name, "RepositoryIndex")
    return kpb.RepositoryIndexResponse(
        models=[
            kpb.RepositoryIndexResponse.ModelIndex(
                name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
            )
            for entry in calls.index(request.ready)
        ]
    )


def load_config(request: kpb.RepositoryModelLoadRequest) -> ModelConfig | None:
    """The config a load gives in its ``config`` parameter, None when it gives none;
    ``InvalidInput`` for any other parameter, a ``file:`` one first."""
    check_repository_name(request.repository_name, "RepositoryModelLoad")
    parameters: Mapping[str, kpb.ModelRepositoryParameter] = request.parameters
    for name in sorted(parameters):
        if name.startswith(FILE_PARAMETER_PREFIX):
            raise InvalidInput(
                f"RepositoryModelLoad parameter {clip(name, 80)!r} uploads a model file; udfserve "
                "loads models only from its repository (--model-repository): expected no 'file:' "
                "parameters, and the model's files placed in the repository by its operator"
            )
    unknown = sorted(set(parameters) - {CONFIG_PARAMETER})
    if unknown:
        raise InvalidInput(
            f"RepositoryModelLoad parameter {clip(unknown[0], 80)!r} is not one udfserve reads; "
            f"expected only {CONFIG_PARAMETER!r} (a JSON string of the model's config.yaml fields)"
        )
    if CONFIG_PARAMETER not in parameters:
        return None
    parameter = parameters[CONFIG_PARAMETER]
    if parameter.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInput(
            f"RepositoryModelLoad parameter {CONFIG_PARAMETER!r} is a "
            f"{parameter.WhichOneof('parameter_choice') or 'parameter without a value'}; expected a "
            "string_param holding a JSON object of the model's config.yaml fields"
        )
    return parse_config_json(parameter.string_param, request.model_name, "parameter 'config'")


def check_unload(request: kpb.RepositoryModelUnloadRequest) -> None:
    """``InvalidInput`` for a parameter other than ``unload_dependents`` (which changes nothing)."""
    check_repository_name(request.repository_name, "RepositoryModelUnload")
    unknown = sorted(set(request.parameters) - {UNLOAD_DEPENDENTS_PARAMETER})
    if unknown:
        raise InvalidInput(
            f"RepositoryModelUnload parameter {clip(unknown[0], 80)!r} is not one udfserve reads; "
            f"expected at most {UNLOAD_DEPENDENTS_PARAMETER!r} (no udfserve model has dependents)"
        )
