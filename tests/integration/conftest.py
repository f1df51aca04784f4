"""Real model server processes for the integration tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.model_server.launcher import ServerProcess, launch_server


@pytest.fixture(scope="session")
def socket_dir() -> Iterator[Path]:
    # unix socket paths are limited to about 100 bytes: pytest's tmp paths can be longer
    path = Path(tempfile.mkdtemp(prefix="udfs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server on a temporary unix socket and TCP port 0, serving every example model."""
    logs = tmp_path_factory.mktemp("server-logs")
    process = launch_server(
        example_repository,
        socket=socket_dir / f"s{id(logs) % 10000}.sock",
        port=0,
        http_port=0,
        log_path=logs / "server.log",
    )
    yield process
    process.terminate()
