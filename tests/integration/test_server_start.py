"""Starting a server where another ran: a live server's socket is never taken, a stale one is,
and the launcher leaves no scratch folder behind; a repository with no model to serve is
explained at start-up, in the log and in readiness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from server_harness import batch_of, http_json, request, stream_predict

from udfserve.services.model_server.launcher import (
    ServerNotServing,
    ServerStartError,
    launch_server,
    wait_until_serving,
)

ARGS = ["--models", "tabular_mlp"]
LAYOUT = "<repo>/<model>/config.yaml (optional) and <repo>/<model>/<version>/"


def answers(target: str) -> bool:
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    return stream_predict(target, [request("tabular_mlp", batch)])[0].code == grpc.StatusCode.OK


def test_a_second_server_on_a_socket_in_use_refuses_to_start_and_the_first_serves_on(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    socket = socket_dir / "shared.sock"
    first = launch_server(tabular_onnx_repository, socket=socket, port=None, http_port=None, extra_args=ARGS)
    try:
        with pytest.raises(ServerStartError) as refused:
            launch_server(
                tabular_onnx_repository, socket=socket, port=None, http_port=None, extra_args=ARGS,
                log_path=tmp_path / "second.log",
            )  # fmt: skip
        assert f"cannot listen on unix socket {socket}: another process is listening on it" in str(
            refused.value
        )
        assert answers(first.grpc_target())
    finally:
        first.terminate()


def test_the_socket_of_a_killed_server_is_taken_by_the_next(
    tabular_onnx_repository: Path, socket_dir: Path
) -> None:
    socket = socket_dir / "stale.sock"
    killed = launch_server(tabular_onnx_repository, socket=socket, port=None, http_port=None, extra_args=ARGS)
    killed.kill()  # SIGKILL: the socket file stays, nothing listens on it
    assert socket.is_socket()
    next_server = launch_server(
        tabular_onnx_repository, socket=socket, port=None, http_port=None, extra_args=ARGS
    )
    try:
        assert answers(next_server.grpc_target())
    finally:
        next_server.terminate()


def test_the_launchers_scratch_folder_goes_with_the_server(
    tabular_onnx_repository: Path, socket_dir: Path
) -> None:
    server = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "scratch.sock",
        port=None,
        http_port=None,
        extra_args=ARGS,
    )
    scratch = server.ready_file.parent
    assert scratch.is_dir()
    server.terminate()
    assert not scratch.exists()


def serve(tabular_onnx_repository: Path, socket_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "udfserve", "serve", "--model-repository", str(tabular_onnx_repository),
        "--socket", str(socket_dir / "refused.sock"), "--port", "off", "--http-port", "off", *ARGS, *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("UDFSERVE_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_a_token_file_that_cannot_be_read_stops_the_start_naming_the_flag(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    refused = serve(tabular_onnx_repository, socket_dir, "--auth-token-file", str(tmp_path / "none"))
    assert refused.returncode == 2, refused.stderr
    assert f"refusing to start: cannot read --auth-token-file {tmp_path / 'none'}" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_http_host_that_does_not_resolve_stops_the_start_naming_the_flag(
    tabular_onnx_repository: Path, socket_dir: Path
) -> None:
    refused = serve(
        tabular_onnx_repository, socket_dir,
        "--http-host", "no-such-host.invalid", "--http-port", "0", "--allow-insecure-remote",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert (
        "refusing to start: cannot listen on --http-host no-such-host.invalid --http-port 0" in refused.stderr
    )
    assert "Traceback" not in refused.stderr


def start_without_models(repository: Path, socket_dir: Path, tmp_path: Path) -> tuple[str, str, str]:
    """Start a server of ``repository`` and wait for it: the error of the wait, the server's
    /health/ready reason, and its log."""
    server = launch_server(
        repository, socket=socket_dir / "no-models.sock", port=None, http_port=0,
        log_path=tmp_path / "server.log", wait=False,
    )  # fmt: skip
    try:
        with pytest.raises(ServerNotServing) as refused:
            wait_until_serving(server, timeout_s=120)
        status, body = http_json(server.http_address or "", "/health/ready")
        assert status == 503 and isinstance(body, dict)
        reason = str(body["reason"])
    finally:
        server.terminate()
    return str(refused.value), reason, server.log_tail(lines=1_000)


def test_a_models_own_folder_given_as_the_repository_is_named_with_the_repository_it_belongs_to(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    model_folder = tabular_onnx_repository / "tabular_mlp"
    refused, reason, log = start_without_models(model_folder, socket_dir, tmp_path)
    explained = (
        f"model repository {model_folder} holds no servable model: found '1' (no version folder in "
        f"{model_folder / '1'}"
    )
    hint = f"its parent {tabular_onnx_repository} is probably the repository"
    for text in (refused, log):
        assert explained in text and LAYOUT in text
        assert hint in text
    # /health/ready is open to anyone: the same words, with the server's paths left out
    assert "model repository holds no servable model: found '1' (no version folder in 1" in reason
    assert f"its parent {tabular_onnx_repository.name} is probably the repository" in reason
    assert LAYOUT in reason
    assert str(tabular_onnx_repository) not in reason
    assert any(" WARNING " in line and explained in line and hint in line for line in log.splitlines())


def test_an_empty_repository_says_it_is_empty_and_which_layout_it_expects(
    socket_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "repository"
    empty.mkdir()
    refused, reason, log = start_without_models(empty, socket_dir, tmp_path)
    explained = (
        f"model repository {empty} holds no servable model: found nothing, it is empty; expected a folder"
    )
    assert explained in refused
    assert "model repository holds no servable model: found nothing, it is empty" in reason
    assert str(empty) not in reason
    assert any(" WARNING " in line and explained in line for line in log.splitlines())
    assert "is probably the repository" not in reason
