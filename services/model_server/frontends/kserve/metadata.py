"""What the KServe v2 (Triton) protocol tells about the server and its models: server metadata,
model metadata, the model's configuration as Triton writes it (what perf_analyzer reads), and
Triton's per-model statistics.
"""

from __future__ import annotations

from udfserve.log_text import clip
from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.protocol.kserve import model_config_pb2 as mc
from udfserve.runtime.errors import InvalidInput
from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.model_server.core.model_table import ModelTable, ServedModel
from udfserve.services.model_server.frontends.kserve.tensors import (
    DATATYPE_OF_DTYPE,
    advertised_dims,
    parse_version,
)

SERVER_NAME = "udfserve"
EXTENSIONS = ("model_configuration", "model_repository", "statistics")
"""KServe extensions served beyond the core protocol on both protocols (Triton's names for
ModelConfig, the RepositoryIndex / RepositoryModelLoad / RepositoryModelUnload calls, and
ModelStatistics, with their HTTP routes ``.../config``, ``/v2/repository/...`` and ``.../stats``).
Not listed, since not served: ``classification``, ``sequence``, ``schedule_policy``,
``cuda_shared_memory``, ``parameters``, ``trace``, ``logging``, nor
``model_repository(unload_dependents)`` (accepted and meaningless: no model depends on another).
``system_shared_memory`` is listed where it is served (``server_extensions``)."""

SYSTEM_SHARED_MEMORY = "system_shared_memory"
"""Served on every KServe listener (the python and native gRPC front ends, HTTP) unless
``--shared-memory-dir off``, over one table of regions."""

HTTP_EXTENSIONS = ("binary_tensor_data",)
"""Extensions of the HTTP binding alone: listed when the server serves it (``--kserve-http-port``)."""


def server_extensions(http: bool, system_shared_memory: bool = False) -> tuple[str, ...]:
    """The extensions a server lists in its metadata, the same on both protocols as Triton's list is
    the server's: ``http`` when it serves the protocol over HTTP too, ``system_shared_memory`` when
    it serves that."""
    shared = (SYSTEM_SHARED_MEMORY,) if system_shared_memory else ()
    return tuple(sorted(EXTENSIONS + (HTTP_EXTENSIONS if http else ()) + shared))


_PROTO_TYPE_OF_DTYPE = {
    dtype: mc.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")
    for dtype, name in DATATYPE_OF_DTYPE.items()
}
"""Triton's model configuration names BYTES ``TYPE_STRING``."""


def model_metadata(served: ServedModel, versions: list[int]) -> kpb.ModelMetadataResponse:
    """The version's tensors, rows first (``-1``), and the model's ``versions`` serving, as Triton
    lists them."""
    assert served.model is not None and served.source is not None
    model = served.model

    def tensors(specs: tuple[TensorSpec, ...]) -> list[kpb.ModelMetadataResponse.TensorMetadata]:
        return [
            kpb.ModelMetadataResponse.TensorMetadata(
                name=s.name, datatype=DATATYPE_OF_DTYPE[s.dtype], shape=[-1, *advertised_dims(s)]
            )
            for s in specs
        ]

    return kpb.ModelMetadataResponse(
        name=served.name,
        versions=[str(version) for version in versions],
        platform=model.platform,
        inputs=tensors(model.inputs),
        outputs=tensors(model.outputs),
    )


def model_config(served: ServedModel) -> mc.ModelConfig:
    """The model as a Triton ``config.pbtxt`` would describe it: what perf_analyzer reads."""
    assert served.model is not None and served.source is not None
    model, config = served.model, served.source.config

    def reshape(spec: TensorSpec) -> mc.ModelTensorReshape | None:
        return None if spec.shape else mc.ModelTensorReshape(shape=[])

    batching = config.dynamic_batching
    return mc.ModelConfig(
        name=served.name,
        platform=model.platform,
        backend=model.platform,
        version_policy=_version_policy(config),
        max_batch_size=config.max_batch_size,
        input=[
            mc.ModelInput(
                name=s.name,
                data_type=_PROTO_TYPE_OF_DTYPE[s.dtype],
                dims=advertised_dims(s),
                reshape=reshape(s),
            )
            for s in model.inputs
        ],
        output=[
            mc.ModelOutput(
                name=s.name,
                data_type=_PROTO_TYPE_OF_DTYPE[s.dtype],
                dims=advertised_dims(s),
                reshape=reshape(s),
            )
            for s in model.outputs
        ],
        dynamic_batching=(
            mc.ModelDynamicBatching(max_queue_delay_microseconds=round(batching.max_queue_delay_s * 1e6))
            if batching.enabled
            else None
        ),
    )


def _version_policy(config: ModelConfig) -> mc.ModelVersionPolicy:
    """The model's version policy in Triton's words."""
    policy = config.versions
    if policy.latest is not None:
        return mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=policy.latest))
    if policy.specific is not None:
        return mc.ModelVersionPolicy(specific=mc.ModelVersionPolicy.Specific(versions=list(policy.specific)))
    return mc.ModelVersionPolicy(all=mc.ModelVersionPolicy.All())


def model_statistics(models: ModelTable, name: str, version: str) -> kpb.ModelStatisticsResponse:
    """The named model's statistics, or every ready model's for an empty name (as Triton), also
    while the server drains (perf_analyzer reads them after its last request); requests of both
    protocols count (see ``statistics``). Raises the ``ServingError`` of an unknown or unready
    model, or of a version without a name."""
    if name:
        chosen = [models.ready(name, parse_version(version, name), while_draining=True)]
    elif version:
        raise InvalidInput(
            f"version '{clip(version, 40)}' without a model name; expected a name with the version, "
            "or neither for every model"
        )
    else:
        chosen = [served for served in models.all() if served.state == "ready"]
    return kpb.ModelStatisticsResponse(
        model_stats=[
            served.metrics.statistics.to_proto(served.name, served.source.version)
            for served in sorted(chosen, key=lambda served: served.name)
            if served.metrics is not None and served.source is not None
        ]
    )
