"""Real model server processes for the integration tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import running_server

from udfserve.services.model_server.launcher import ServerProcess


@pytest.fixture(scope="session")
def socket_dir() -> Iterator[Path]:
    # unix socket paths are limited to about 100 bytes: pytest's tmp paths can be longer
    path = Path(tempfile.mkdtemp(prefix="udfs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server on a temporary unix socket and TCP port 0, serving every example model, shared by
    every module that asks for it: a start costs seconds (TensorFlow's import alone about four).
    Its users leave it as they found it (they stop, signal, reconfigure or fill nothing of it,
    and read counters as deltas and log lines of their own); a module whose tests need a server's
    state from its start defines a server of its own (``own_server``)."""
    with running_server(
        example_repository, socket_dir, tmp_path_factory, "session-default", port=0, http_port=0
    ) as process:
        yield process


@pytest.fixture
def tabular_repository(tabular_onnx_repository: Path, tmp_path: Path) -> Path:
    """A repository of the test's own holding ``tabular_mlp`` version 1 alone (its ONNX graph: a
    server of it starts without TensorFlow's import), where the test may publish versions
    (``tabular_onnx_version_2``)."""
    root = tmp_path / "repository"
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", root / "tabular_mlp")
    return root
