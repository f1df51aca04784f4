"""``--kserve-socket``: the native KServe front end on a unix socket of its own, beside its port or
instead of it, under the main socket's rules: its file has ``--socket-mode``, a stale socket of a
previous run is replaced, a live one is never taken, a clean stop removes it, and the token is
required on it as on the port. Where ``auto`` finds no native module, the python front end listens
there instead, so the path a node published answers KServe either way."""

from __future__ import annotations

import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from server_harness import running_server_without
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess, ServerStartError, launch_server

pytestmark = pytest.mark.integration

NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"
TOKEN = "socket-s3cret"
HEADERS = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def socket_and_port_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The native front end on a port and a socket at once, with a token and a group-readable mode."""
    folder = tmp_path_factory.mktemp("native-socket")
    (folder / "token").write_text(TOKEN)
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "main.sock",
        extra_args=[
            *("--models", "tabular_mlp", "--kserve-frontend", "native", "--kserve-port", "0"),
            *("--kserve-socket", str(socket_dir / "main.kserve.sock"), "--socket-mode", "0660"),
            *("--auth-token-file", str(folder / "token")),
        ],
        log_path=folder / "server.log",
    )
    yield process
    process.terminate()


def features(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, 64)).astype(np.float32)


def probabilities(target: str, rows: int) -> np.ndarray:
    tensor = triton.InferInput("features", [rows, 64], "FP32")
    tensor.set_data_from_numpy(features(rows))
    with triton.InferenceServerClient(target) as client:
        return client.infer("tabular_mlp", [tensor], headers=HEADERS).as_numpy("probabilities")


def stale_socket(path: Path) -> None:
    """A socket file nothing listens on, as a server killed with SIGKILL leaves behind."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
    assert path.is_socket()


def test_the_ready_file_names_the_kserve_socket_beside_the_port(
    socket_and_port_server: ServerProcess,
) -> None:
    server = socket_and_port_server
    assert server.kserve_frontend == "native"
    assert server.kserve_socket is not None and server.kserve_socket.endswith("main.kserve.sock")
    assert server.kserve_address is not None and server.kserve_address != server.tcp_address


def test_tritonclient_at_the_unix_socket_gets_the_answers_of_the_port(
    socket_and_port_server: ServerProcess,
) -> None:
    server = socket_and_port_server
    assert server.kserve_address is not None
    on_socket = probabilities(f"unix://{server.kserve_socket}", 5)
    assert on_socket.shape == (5, 8)
    np.testing.assert_allclose(on_socket, probabilities(server.kserve_address, 5), rtol=1e-6)


def test_a_call_on_the_socket_without_the_token_is_unauthenticated(
    socket_and_port_server: ServerProcess,
) -> None:
    with (
        triton.InferenceServerClient(f"unix://{socket_and_port_server.kserve_socket}") as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.is_server_live()
    assert raised.value.status() == "StatusCode.UNAUTHENTICATED"


def test_the_kserve_socket_has_the_mode_of_the_main_socket(socket_and_port_server: ServerProcess) -> None:
    assert socket_and_port_server.kserve_socket is not None
    assert stat.S_IMODE(Path(socket_and_port_server.kserve_socket).stat().st_mode) == 0o660


def test_a_server_refuses_to_start_on_a_kserve_socket_another_server_listens_on(
    socket_and_port_server: ServerProcess, tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    taken = socket_and_port_server.kserve_socket
    assert taken is not None
    with pytest.raises(ServerStartError) as raised:
        launch_server(
            tabular_onnx_repository,
            socket=socket_dir / "second.sock",
            extra_args=["--models", "tabular_mlp", "--kserve-frontend", "native", "--kserve-socket", taken],
            log_path=tmp_path / "server.log",
        )
    assert "another process is listening on it" in str(raised.value)
    assert "another --kserve-socket" in str(raised.value)
    assert probabilities(f"unix://{taken}", 1).shape == (1, 8), "the first server keeps its socket"


@pytest.fixture
def socket_only_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path
) -> Iterator[ServerProcess]:
    """The native front end on a socket alone, started where a previous run left its socket behind."""
    path = socket_dir / "only.kserve.sock"
    stale_socket(path)
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "only.sock",
        extra_args=["--models", "tabular_mlp", "--kserve-frontend", "native", "--kserve-socket", str(path)],
        log_path=tmp_path / "server.log",
    )
    yield process
    process.terminate()


def test_a_stale_kserve_socket_of_a_previous_run_is_replaced(socket_only_server: ServerProcess) -> None:
    assert socket_only_server.kserve_address is None, "no --kserve-port: the socket alone"
    with triton.InferenceServerClient(f"unix://{socket_only_server.kserve_socket}") as client:
        assert client.is_model_ready("tabular_mlp")


def test_a_clean_stop_removes_the_kserve_socket(socket_only_server: ServerProcess) -> None:
    assert socket_only_server.kserve_socket is not None
    path = Path(socket_only_server.kserve_socket)
    assert path.is_socket()
    assert socket_only_server.terminate() == 0
    assert not path.exists()


def test_without_the_native_module_auto_serves_the_kserve_socket_with_the_python_front_end(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = socket_dir / "fallback.kserve.sock"
    arguments = ["--models", "tabular_mlp", "--kserve-frontend", "auto", "--kserve-socket", str(path)]
    with running_server_without(
        [NATIVE_MODULE], tabular_onnx_repository, socket_dir, tmp_path_factory, "socket-fallback", arguments
    ) as server:
        assert server.kserve_frontend == "python"
        assert server.kserve_socket == str(path)
        with triton.InferenceServerClient(f"unix://{path}") as client:
            assert client.is_model_ready("tabular_mlp")
