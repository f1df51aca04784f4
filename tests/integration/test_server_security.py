"""Who may connect: loopback by default, TLS or an explicit flag beyond it, an optional token."""

from __future__ import annotations

import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from certificates import make_pki
from server_harness import batch_of, request

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def predict_one(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> pb.PredictResponse:
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    stub = pb_grpc.InferenceStub(channel)
    return next(iter(stub.Predict(iter([request("tabular_mlp", batch)]), timeout=30, metadata=metadata)))


def serve_command_exit(repository: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "udfserve", "serve", "--model-repository", str(repository), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_plaintext_listener_beyond_loopback_is_refused_naming_the_choices(
    tabular_onnx_repository: Path,
) -> None:
    result = serve_command_exit(
        tabular_onnx_repository, "--host", "0.0.0.0", "--port", "0", "--http-port", "off"
    )
    assert result.returncode == 2
    assert "0.0.0.0" in result.stderr and "--tls-cert-file" in result.stderr
    assert "--allow-insecure-remote" in result.stderr


def test_a_plaintext_http_admin_app_beyond_loopback_is_refused_too(tabular_onnx_repository: Path) -> None:
    result = serve_command_exit(
        tabular_onnx_repository, "--port", "0", "--http-host", "0.0.0.0", "--http-port", "0"
    )
    assert result.returncode == 2 and "--http-host 0.0.0.0" in result.stderr


def test_the_unix_socket_is_private_to_the_servers_user_by_default(server: ServerProcess) -> None:
    mode = stat.S_IMODE(Path(server.unix_socket or "").stat().st_mode)
    assert mode == 0o600


@pytest.fixture(scope="module")
def tls_server(tabular_onnx_repository: Path, pki: Path, tmp_path_factory: pytest.TempPathFactory):
    process = launch_server(
        tabular_onnx_repository,
        port=0,
        http_port=0,
        extra_args=[
            "--models", "tabular_mlp",
            "--host", "0.0.0.0",
            "--tls-cert-file", str(pki / "server.pem"),
            "--tls-key-file", str(pki / "server.key"),
            "--tls-client-ca-file", str(pki / "ca.pem"),
        ],
        log_path=tmp_path_factory.mktemp("tls") / "server.log",
        health_credentials=grpc.ssl_channel_credentials(
            root_certificates=(pki / "ca.pem").read_bytes(),
            private_key=(pki / "client.key").read_bytes(),
            certificate_chain=(pki / "client.pem").read_bytes(),
        ),
    )  # fmt: skip
    yield process
    process.terminate()


def tls_target(server: ServerProcess) -> str:
    return "localhost:" + (server.tcp_address or "").rsplit(":", 1)[1]


def test_mutual_tls_serves_a_client_with_a_certificate_of_the_ca(
    tls_server: ServerProcess, pki: Path
) -> None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes(),
        certificate_chain=(pki / "client.pem").read_bytes(),
    )
    with grpc.secure_channel(tls_target(tls_server), credentials) as channel:
        assert not predict_one(channel).HasField("error")


def test_mutual_tls_refuses_a_client_without_a_certificate(tls_server: ServerProcess, pki: Path) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    with (
        grpc.secure_channel(tls_target(tls_server), credentials) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        predict_one(channel)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_cannot_talk_to_a_tls_listener(tls_server: ServerProcess) -> None:
    with grpc.insecure_channel(tls_target(tls_server)) as channel, pytest.raises(grpc.RpcError):
        predict_one(channel)


def tls_flags(pki: Path) -> list[str]:
    return ["--tls-cert-file", str(pki / "server.pem"), "--tls-key-file", str(pki / "server.key")]


def test_a_tls_listener_beyond_loopback_authenticating_no_client_is_refused_naming_the_choices(
    tabular_onnx_repository: Path, pki: Path
) -> None:
    result = serve_command_exit(
        tabular_onnx_repository, "--host", "0.0.0.0", "--port", "0", "--http-port", "off", *tls_flags(pki)
    )

    assert result.returncode == 2
    assert "--host 0.0.0.0 (--port)" in result.stderr and "authenticates no client" in result.stderr
    for choice in ("--auth-token", "--tls-client-ca-file", "--allow-unauthenticated-remote"):
        assert choice in result.stderr


def test_a_tls_listener_beyond_loopback_authenticating_no_client_serves_when_the_operator_says_so(
    tabular_onnx_repository: Path, pki: Path, tmp_path: Path
) -> None:
    server_only = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    process = launch_server(
        tabular_onnx_repository,
        port=0,
        http_port=None,
        extra_args=[
            "--models", "tabular_mlp", "--host", "0.0.0.0", *tls_flags(pki), "--allow-unauthenticated-remote"
        ],
        log_path=tmp_path / "server.log",
        health_credentials=server_only,
    )  # fmt: skip
    try:
        with grpc.secure_channel(tls_target(process), server_only) as channel:
            assert not predict_one(channel).HasField("error")
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def token_server(tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("token")
    (folder / "token").write_text(TOKEN + "\n")
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "token.sock",
        http_port=0,
        extra_args=["--models", "tabular_mlp", "--auth-token-file", str(folder / "token"), "--http-docs"],
        log_path=folder / "server.log",
    )
    yield process
    process.terminate()


def test_with_a_token_configured_predict_without_it_is_unauthenticated(token_server: ServerProcess) -> None:
    with grpc.insecure_channel(token_server.grpc_target()) as channel, pytest.raises(grpc.RpcError) as raised:
        predict_one(channel)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer" in (raised.value.details() or "")


def test_with_the_right_token_predict_is_served(token_server: ServerProcess) -> None:
    with grpc.insecure_channel(token_server.grpc_target()) as channel:
        response = predict_one(channel, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert not response.HasField("error")


def test_a_wrong_token_is_unauthenticated_for_model_listing_too(token_server: ServerProcess) -> None:
    with grpc.insecure_channel(token_server.grpc_target()) as channel, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.InferenceStub(channel).ListModels(
            pb.ListModelsRequest(), timeout=10, metadata=(("authorization", "Bearer wrong"),)
        )
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


def http_status(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_http_model_endpoints_need_the_token_while_health_stays_open(token_server: ServerProcess) -> None:
    base = f"http://{token_server.http_address}"
    assert http_status(f"{base}/v1/models") == 401
    assert http_status(f"{base}/v1/models/tabular_mlp", token="wrong") == 401
    assert http_status(f"{base}/v1/models", token=TOKEN) == 200
    assert http_status(f"{base}/health/live") == 200
    assert http_status(f"{base}/health/ready") == 200


def test_metrics_need_the_token_as_the_spark_applications_do(token_server: ServerProcess) -> None:
    """Both name the Spark applications of the node's users (ids and names in the labels)."""
    base = f"http://{token_server.http_address}"
    for path in ("/metrics", "/v1/spark/applications"):
        assert http_status(f"{base}{path}") == 401, path
        assert http_status(f"{base}{path}", token="wrong") == 401, path
        assert http_status(f"{base}{path}", token=TOKEN) == 200, path


def test_the_openapi_document_asked_for_needs_the_token(token_server: ServerProcess) -> None:
    base = f"http://{token_server.http_address}"
    assert http_status(f"{base}/openapi.json") == 401
    assert http_status(f"{base}/openapi.json", token=TOKEN) == 200
