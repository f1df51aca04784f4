"""What the model control tests share: a repository of their own and the calls' outcomes."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc

EXPLICIT = ["--model-control", "explicit"]


def control_repository(example_repository: Path, folder: Path, models: Sequence[str]) -> Path:
    """A repository of ``models`` copied from the example one (never written to: other tests'
    servers read it), in which a test may add versions and folders."""
    root = folder / "repository"
    root.mkdir()
    for name in models:
        shutil.copytree(example_repository / name, root / name)
    return root


def add_version(repository: Path, model: str, version: int) -> None:
    """A copy of version 1 of ``model`` as ``version``: the same weights under another number."""
    shutil.copytree(repository / model / "1", repository / model / str(version))


def status_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """The status a gRPC call ends with, and its message."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def index_states(
    stub: pb_grpc.InferenceStub, model: str, metadata: Sequence[tuple[str, str]] = ()
) -> dict[int, str]:
    """The states ``RepositoryIndex`` lists for ``model``, by version (0: the model as a whole)."""
    response = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=60, metadata=metadata)
    return {
        entry.version: pb.VersionState.Name(entry.state).removeprefix("VERSION_STATE_")
        for entry in response.models
        if entry.model == model
    }
