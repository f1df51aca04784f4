"""The unix socket is never reachable with more permissions than ``--socket-mode``, whatever the umask.

A socket file appears with ``0777`` less the umask; under umask 000 a socket bound at its path and
chmod-ed afterwards is open to every local user for a moment. The server binds it in a folder only
its user can enter, gives it its mode there, and renames it into place.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from udfserve.services.model_server.launcher import launch_server, wait_until_serving
from udfserve.services.model_server.unix_socket import bind_private_unix_socket


@pytest.fixture
def folder() -> Iterator[Path]:
    # unix socket paths are limited to about 100 bytes: pytest's tmp paths can be longer
    path = Path(tempfile.mkdtemp(prefix="udfs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """Umask 000 in this process (and the children it starts meanwhile), restored after."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def grpc_server() -> Iterator[grpc.Server]:
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    yield server
    server.stop(None)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_socket_appears_only_in_a_folder_private_to_the_servers_user_until_it_has_its_mode(
    folder: Path, permissive_umask: None, grpc_server: grpc.Server
) -> None:
    path = folder / "server.sock"
    at_bind: list[tuple[int, int, int, bool]] = []

    def bind(target: str) -> int:
        port = grpc_server.add_insecure_port(target)
        bound = Path(target.removeprefix("unix:"))
        at_bind.append((mode_of(bound.parent), bound.parent.stat().st_uid, mode_of(bound), path.exists()))
        return port

    bind_private_unix_socket(path, 0o600, bind)

    # the moment gRPC created it, with the umask's mode 0777: only reachable through a 0700 folder
    assert at_bind == [(0o700, os.getuid(), 0o777, False)]
    assert path.is_socket() and mode_of(path) == 0o600
    assert sorted(entry.name for entry in folder.iterdir()) == ["server.sock"]


def test_the_renamed_socket_serves(folder: Path, grpc_server: grpc.Server) -> None:
    path = folder / "server.sock"

    bind_private_unix_socket(path, 0o660, grpc_server.add_insecure_port)
    grpc_server.start()

    with grpc.insecure_channel(f"unix:{path}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert mode_of(path) == 0o660


def test_a_path_holding_a_file_that_is_not_a_socket_is_refused_and_left_alone(
    folder: Path, grpc_server: grpc.Server
) -> None:
    path = folder / "server.sock"
    path.write_text("someone's data\n")

    with pytest.raises(OSError, match=r"server\.sock: a file that is not a socket is there"):
        bind_private_unix_socket(path, 0o600, grpc_server.add_insecure_port)

    assert path.read_text() == "someone's data\n"
    assert [entry.name for entry in folder.iterdir()] == ["server.sock"]


def test_a_failed_bind_names_the_socket_and_leaves_no_private_folder(folder: Path) -> None:
    path = folder / "server.sock"

    def bind(target: str) -> int:
        raise OSError(f"cannot listen on {target}: the address is taken or not allowed")

    with pytest.raises(OSError, match=rf"cannot listen on unix socket {path}: cannot listen on unix:"):
        bind_private_unix_socket(path, 0o600, bind)

    assert list(folder.iterdir()) == []


def test_a_server_started_under_umask_000_serves_on_a_socket_of_its_mode_and_leaves_no_folder(
    folder: Path, tabular_onnx_repository: Path, tmp_path: Path
) -> None:
    path = folder / "server.sock"
    previous = os.umask(0)  # inherited by the server child only for its start
    try:
        server = launch_server(
            tabular_onnx_repository,
            socket=path,
            port=None,
            http_port=None,
            extra_args=["--models", "tabular_mlp"],
            log_path=tmp_path / "server.log",
            wait=False,
        )
    finally:
        os.umask(previous)
    try:
        wait_until_serving(server, timeout_s=120)

        assert mode_of(path) == 0o600
        assert [entry.name for entry in folder.iterdir()] == ["server.sock"]
    finally:
        server.terminate()
