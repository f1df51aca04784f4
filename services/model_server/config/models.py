"""Settings of the model repository a server serves, which of its models load, and how long a
replaced version stays loaded for the Spark jobs that pinned it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field
from pydantic_settings import NoDecode

from udfserve.runtime.model_config import validate_model_name


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return value


ModelNames = Annotated[
    tuple[str, ...],
    NoDecode,  # "a,b" from a flag or a variable is split here, not read as JSON
    BeforeValidator(_split_commas),
    AfterValidator(lambda names: tuple(validate_model_name(name) for name in names)),
]
"""Names of models to load: comma-separated in a flag or a variable, each a valid model name. The
server's and the node's ``--models`` both take it."""


class ModelSettings(BaseModel):
    """The repository and the versions kept leased (``core.version_leases``)."""

    model_repository: Path = Field(description="folder of <model>/config.yaml and <model>/<version>/")
    models: ModelNames = Field(default=(), description="load only these models (default: all)")
    version_lease_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86400.0,
        description="a version the policy no longer serves stays loaded for requests that name it "
        "(a Spark job pins the version it started with) until this long after the last of them, and "
        "at least this long after it was replaced; 0: unloaded at once, as it used to be",
    )
    max_leased_versions: int = Field(
        default=2,
        ge=0,
        le=16,
        description="older versions of one model kept for leases at once; a version replaced past it "
        "is unloaded at once, and requests naming it are refused NOT_FOUND saying why",
    )
    max_leased_version_bytes: int = Field(
        default=8 << 30,
        ge=0,
        description="bytes of model files (on disk) of the versions kept for leases, over every model; "
        "a version that would take it past is unloaded at once",
    )
