"""Starting a server where another ran: a live server's socket is never taken, a stale one is,
and the launcher leaves no scratch folder behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from server_harness import batch_of, request, stream_predict

from services.model_server.launcher import ServerStartError, launch_server

ARGS = ["--models", "tabular_mlp"]


def answers(target: str) -> bool:
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    return stream_predict(target, [request("tabular_mlp", batch)])[0].code == grpc.StatusCode.OK


def test_a_second_server_on_a_socket_in_use_refuses_to_start_and_the_first_serves_on(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    socket = socket_dir / "shared.sock"
    first = launch_server(example_repository, socket=socket, port=None, http_port=None, extra_args=ARGS)
    try:
        with pytest.raises(ServerStartError) as refused:
            launch_server(
                example_repository, socket=socket, port=None, http_port=None, extra_args=ARGS,
                log_path=tmp_path / "second.log",
            )  # fmt: skip
        assert f"cannot listen on unix socket {socket}: another process is listening on it" in str(
            refused.value
        )
        assert answers(first.grpc_target())
    finally:
        first.terminate()


def test_the_socket_of_a_killed_server_is_taken_by_the_next(
    example_repository: Path, socket_dir: Path
) -> None:
    socket = socket_dir / "stale.sock"
    killed = launch_server(example_repository, socket=socket, port=None, http_port=None, extra_args=ARGS)
    killed.kill()  # SIGKILL: the socket file stays, nothing listens on it
    assert socket.is_socket()
    next_server = launch_server(example_repository, socket=socket, port=None, http_port=None, extra_args=ARGS)
    try:
        assert answers(next_server.grpc_target())
    finally:
        next_server.terminate()


def test_the_launchers_scratch_folder_goes_with_the_server(
    example_repository: Path, socket_dir: Path
) -> None:
    server = launch_server(
        example_repository, socket=socket_dir / "scratch.sock", port=None, http_port=None, extra_args=ARGS
    )
    scratch = server.ready_file.parent
    assert scratch.is_dir()
    server.terminate()
    assert not scratch.exists()


def serve(example_repository: Path, socket_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "services", "serve", "--model-repository", str(example_repository),
        "--socket", str(socket_dir / "refused.sock"), "--port", "off", "--http-port", "off", *ARGS, *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("UDFSERVE_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_a_token_file_that_cannot_be_read_stops_the_start_naming_the_flag(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    refused = serve(example_repository, socket_dir, "--auth-token-file", str(tmp_path / "none"))
    assert refused.returncode == 2, refused.stderr
    assert f"refusing to start: cannot read --auth-token-file {tmp_path / 'none'}" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_http_host_that_does_not_resolve_stops_the_start_naming_the_flag(
    example_repository: Path, socket_dir: Path
) -> None:
    refused = serve(
        example_repository, socket_dir,
        "--http-host", "no-such-host.invalid", "--http-port", "0", "--allow-insecure-remote",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert (
        "refusing to start: cannot listen on --http-host no-such-host.invalid --http-port 0" in refused.stderr
    )
    assert "Traceback" not in refused.stderr
