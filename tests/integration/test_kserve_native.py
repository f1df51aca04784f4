"""``--kserve-frontend native``: what is its own. ``test_kserve.py`` runs the protocol's behaviour
(health, metadata, every datatype, errors, statistics, metrics) against both front ends; here: its
own port, exactly-once answers under many concurrent calls, streams left to the main port, the
token and mutual TLS on every call, and draining on SIGTERM. System shared memory on this port:
``test_kserve_native_shared_memory.py``."""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from certificates import make_pki
from server_harness import batch_of, column_to_numpy, request, stream_predict, wait_until_idle
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess, launch_server

NATIVE = ["--kserve-frontend", "native", "--kserve-port", "0"]
TOKEN = "native-s3cret"


@pytest.fixture(scope="module")
def native_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch_server(
        example_repository,
        socket=socket_dir / "native.sock",
        extra_args=["--models", "tabular_mlp", *NATIVE],
        log_path=tmp_path_factory.mktemp("native") / "server.log",
    )
    yield process
    process.terminate()


def features(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, 64)).astype(np.float32)


def infer_input(x: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def arrow_answer(server: ServerProcess, x: np.ndarray) -> np.ndarray:
    answer = stream_predict(server.grpc_target(), [request("tabular_mlp", batch_of({"features": x}))])[0]
    return column_to_numpy(answer.outputs.column("probabilities"))


def test_it_listens_on_a_port_of_its_own_named_in_the_ready_file(native_server: ServerProcess) -> None:
    assert native_server.kserve_address is not None
    assert native_server.kserve_address != native_server.tcp_address
    with triton.InferenceServerClient(native_server.kserve_address) as client:
        assert client.is_server_live() and client.is_model_ready("tabular_mlp")


def test_concurrent_calls_are_each_answered_once_with_their_own_rows(native_server: ServerProcess) -> None:
    """Calls merged into shared batches must get back exactly their own rows: 300 calls of 1 to 9
    rows, 16 at a time, each compared with the Arrow path's answer to the same rows."""
    assert native_server.kserve_address is not None
    inputs = {str(i): features(1 + i % 9, seed=i) for i in range(300)}
    answers: queue.Queue[tuple[str, np.ndarray | None, InferenceServerException | None]] = queue.Queue()
    window = threading.Semaphore(16)

    def done(
        request_id: str, result: triton.InferResult | None, error: InferenceServerException | None
    ) -> None:
        window.release()
        answers.put((request_id, None if result is None else result.as_numpy("probabilities"), error))

    with triton.InferenceServerClient(native_server.kserve_address) as client:
        for request_id, x in inputs.items():
            window.acquire()
            client.async_infer(
                "tabular_mlp",
                [infer_input(x)],
                callback=lambda result, error, request_id=request_id: done(request_id, result, error),
                request_id=request_id,
            )
        received = [answers.get(timeout=60) for _ in inputs]
    assert sorted(request_id for request_id, _, _ in received) == sorted(inputs)
    assert [error for _, _, error in received if error is not None] == []
    reference = arrow_answer(native_server, np.concatenate(list(inputs.values())))
    offsets = np.cumsum([0, *(len(x) for x in inputs.values())])
    for position, request_id in enumerate(inputs):
        answer = next(values for rid, values, _ in received if rid == request_id)
        np.testing.assert_allclose(answer, reference[offsets[position] : offsets[position + 1]], atol=1e-6)


def test_calls_whose_deadline_passed_are_dropped_not_run(native_server: ServerProcess) -> None:
    """A call whose client gave up is cancelled in the batcher, as on the main port: 40 calls of
    4,096 rows with a 20 ms deadline must not all be run and counted as answered."""
    assert native_server.kserve_address is not None
    message = service_pb2.ModelInferRequest(model_name="tabular_mlp")
    message.inputs.add(name="features", datatype="FP32", shape=[4096, 64])
    message.raw_input_contents.append(features(4096, seed=5).tobytes())
    with triton.InferenceServerClient(native_server.kserve_address) as client:
        before = client.get_inference_statistics("tabular_mlp").model_stats[0].inference_stats.success.count
        with grpc.insecure_channel(native_server.kserve_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            calls = [stub.ModelInfer.future(message, timeout=0.02) for _ in range(40)]
            answered = sum(call.exception() is None for call in calls)
        assert native_server.http_address is not None
        wait_until_idle(native_server.http_address)  # nothing of the 40 calls is queued any more
        after = client.get_inference_statistics("tabular_mlp").model_stats[0].inference_stats.success.count
    # a call may finish on the server just as its deadline passes on the client: a few, not most
    assert after - before <= answered + 10


def test_bytes_that_are_no_request_are_refused_and_the_port_keeps_serving(
    native_server: ServerProcess,
) -> None:
    """Random bytes and cut messages, on the decoded path's method and on another: each answered
    with an error status, none left waiting, then a good call is answered."""
    assert native_server.kserve_address is not None
    good = service_pb2.ModelInferRequest(model_name="tabular_mlp")
    good.inputs.add(name="features", datatype="FP32", shape=[2, 64])
    good.raw_input_contents.append(features(2, seed=3).tobytes())
    serialized = good.SerializeToString()
    rng = np.random.default_rng(11)
    payloads = [rng.bytes(int(size)) for size in rng.integers(1, 600, size=20)]
    payloads += [serialized[:cut] for cut in (3, 17, len(serialized) // 2, len(serialized) - 1)]
    with grpc.insecure_channel(native_server.kserve_address) as channel:
        for method in ("ModelInfer", "ModelMetadata"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            for payload in payloads:
                try:
                    call(payload, timeout=30)
                except grpc.RpcError as error:
                    assert error.code() != grpc.StatusCode.DEADLINE_EXCEEDED, (method, payload)
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(good, timeout=30)
    assert list(answer.outputs[0].shape) == [2, 8]


def test_a_stream_on_the_native_port_is_refused_naming_the_main_port(native_server: ServerProcess) -> None:
    assert native_server.kserve_address is not None
    with grpc.insecure_channel(native_server.kserve_address) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([service_pb2.ModelInferRequest(model_name="tabular_mlp")]), timeout=30
        )
        with pytest.raises(grpc.RpcError) as raised:
            list(stream)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "main gRPC port" in (raised.value.details() or "")


@pytest.fixture(scope="module")
def token_server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("native-token")
    (folder / "token").write_text(TOKEN)
    process = launch_server(
        example_repository,
        extra_args=["--models", "tabular_mlp", "--auth-token-file", str(folder / "token"), *NATIVE],
        log_path=folder / "server.log",
    )
    yield process
    process.terminate()


@pytest.mark.parametrize("call", ["ServerLive", "ModelInfer"])
def test_with_a_token_every_native_call_without_it_is_unauthenticated(
    token_server: ServerProcess, call: str
) -> None:
    assert token_server.kserve_address is not None
    with (
        triton.InferenceServerClient(token_server.kserve_address) as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        if call == "ServerLive":
            client.is_server_live(headers={"authorization": "Bearer wrong"})
        else:
            client.infer("tabular_mlp", [infer_input(features(2, 0))])
    assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
    assert "authorization: Bearer" in raised.value.message()


def test_with_the_token_native_calls_are_served(token_server: ServerProcess) -> None:
    assert token_server.kserve_address is not None
    headers = {"authorization": f"Bearer {TOKEN}"}
    with triton.InferenceServerClient(token_server.kserve_address) as client:
        result = client.infer("tabular_mlp", [infer_input(features(2, 0))], headers=headers)
        assert result.as_numpy("probabilities").shape == (2, 8)
        assert client.get_model_metadata("tabular_mlp", headers=headers).name == "tabular_mlp"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("native-pki"))


@pytest.fixture(scope="module")
def tls_server(
    example_repository: Path, pki: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch_server(
        example_repository,
        socket=socket_dir / "native-tls.sock",
        extra_args=[
            "--models", "tabular_mlp",
            "--tls-cert-file", str(pki / "server.pem"),
            "--tls-key-file", str(pki / "server.key"),
            "--tls-client-ca-file", str(pki / "ca.pem"),
            *NATIVE,
        ],
        log_path=tmp_path_factory.mktemp("native-tls") / "server.log",
    )  # fmt: skip
    yield process
    process.terminate()


def tls_client(server: ServerProcess, pki: Path, with_certificate: bool) -> triton.InferenceServerClient:
    port = (server.kserve_address or "").rsplit(":", 1)[1]
    return triton.InferenceServerClient(
        f"localhost:{port}",
        ssl=True,
        root_certificates=str(pki / "ca.pem"),
        private_key=str(pki / "client.key") if with_certificate else None,
        certificate_chain=str(pki / "client.pem") if with_certificate else None,
    )


def test_mutual_tls_serves_a_client_with_a_certificate_of_the_ca(
    tls_server: ServerProcess, pki: Path
) -> None:
    with tls_client(tls_server, pki, with_certificate=True) as client:
        assert client.infer("tabular_mlp", [infer_input(features(3, 1))]).as_numpy("probabilities").shape == (
            3,
            8,
        )


def test_mutual_tls_refuses_a_client_without_a_certificate(tls_server: ServerProcess, pki: Path) -> None:
    with (
        tls_client(tls_server, pki, with_certificate=False) as client,
        pytest.raises(InferenceServerException),
    ):
        client.infer("tabular_mlp", [infer_input(features(3, 1))], client_timeout=10)


@pytest.mark.slow
def test_sigterm_answers_every_accepted_native_call_and_exits_zero(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    server = launch_server(
        example_repository,
        socket=socket_dir / "native-drain.sock",
        extra_args=["--models", "sequence_bilstm", "--grace-period-s", "20", *NATIVE],
        log_path=tmp_path / "server.log",
    )
    assert server.kserve_address is not None
    lines = np.random.default_rng(0).normal(size=(256, 16, 32)).astype(np.float32)
    tensor = triton.InferInput("lines", list(lines.shape), "FP32")
    tensor.set_data_from_numpy(lines)
    answers: queue.Queue[tuple[int, InferenceServerException | None]] = queue.Queue()
    with triton.InferenceServerClient(server.kserve_address) as client:
        for i in range(40):
            client.async_infer(
                "sequence_bilstm",
                [tensor],
                callback=lambda result, error, i=i: answers.put((i, error)),
            )
        first = answers.get(timeout=60)
        os.kill(server.pid, signal.SIGTERM)
        received = [first] + [answers.get(timeout=60) for _ in range(39)]
    assert server.process.wait(timeout=30) == 0
    assert sorted(i for i, _ in received) == list(range(40)), "every call got exactly one answer"
    refused = [error for _, error in received if error is not None]
    assert all(error.status() == "StatusCode.UNAVAILABLE" for error in refused)
    assert len(refused) < 40
    assert "draining" in server.log_tail()
