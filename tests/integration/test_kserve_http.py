"""The KServe v2 protocol over HTTP (``--kserve-http-port``), spoken by tritonclient's HTTP client
and by plain HTTP to a real udfserve process.

Every test of the first part runs against both places the port may run (``--kserve-http-loop
serving`` and ``own``). Answers are compared with the same server's gRPC KServe answers: both
protocols go through the same servicer and batcher, so they must agree in values, statuses and
words. The second part is a server with a token, a small message limit and ``--model-control
explicit``: the token, the body limit and the repository routes. It, and the servers stopped by
SIGTERM, serve the tabular model's ONNX graph.
"""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import yaml
from onnx_graphs import text_graph, write_model
from server_harness import http_json, keras_reference, metric_value, scrape
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess, launch_server

SMALL_QUEUE_ROWS = 8
TOKEN = "kserve-http-token"


@pytest.fixture(scope="module", params=["serving", "own"])
def http_server(
    request: pytest.FixtureRequest,
    example_repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("kserve-http-repo")
    for name in ("tabular_mlp", "multi_io", "text_hashing"):
        shutil.copytree(example_repository / name, repository / name)
    small_queue = repository / "small_queue"
    shutil.copytree(example_repository / "sequence_bilstm", small_queue)
    (small_queue / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "small_queue",
                "max_batch_size": SMALL_QUEUE_ROWS,
                "dynamic_batching": {"max_queue_delay_s": 0.001, "max_queue_rows": 2 * SMALL_QUEUE_ROWS},
            }
        )
    )
    write_model(repository, "text_identity", text_graph())
    process = launch_server(
        repository,
        socket=socket_dir / f"kserve-http-{request.param}.sock",
        log_path=repository.parent / f"kserve-http-{request.param}.log",
        extra_args=["--kserve-http-port", "0", "--kserve-http-loop", request.param],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def client(http_server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    assert http_server.kserve_http_address is not None
    with triton_http.InferenceServerClient(http_server.kserve_http_address) as http_client:
        yield http_client


@pytest.fixture(scope="module")
def grpc_client(http_server: ServerProcess) -> Iterator[triton_grpc.InferenceServerClient]:
    assert http_server.tcp_address is not None
    with triton_grpc.InferenceServerClient(http_server.tcp_address) as grpc_client:
        yield grpc_client


def http_input(name: str, values: np.ndarray, datatype: str, binary: bool = True) -> triton_http.InferInput:
    tensor = triton_http.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def grpc_input(name: str, values: np.ndarray, datatype: str) -> triton_grpc.InferInput:
    return triton_grpc.InferInput(name, list(values.shape), datatype).set_data_from_numpy(values)


def features(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, 64)).astype(np.float32)


def texts(rows: int) -> np.ndarray:
    words = np.random.default_rng(rows).integers(0, 1000, size=rows)
    return np.array([f"texte n°{word}".encode() for word in words], dtype=object)


def http_refusal(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value


def raw_http(
    address: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request with nothing but the standard library; status, headers, body."""
    request = urllib.request.Request(
        f"http://{address}{path}", data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


# -- health and metadata -----------------------------------------------------------------------
def test_server_metadata_lists_the_same_extensions_on_both_protocols(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    over_http = client.get_server_metadata()
    over_grpc = grpc_client.get_server_metadata()
    assert over_http["name"] == over_grpc.name == "udfserve"
    assert (
        over_http["extensions"]
        == list(over_grpc.extensions)
        == [
            "binary_tensor_data",
            "model_configuration",
            "model_repository",
            "statistics",
            "system_shared_memory",
        ]
    )


def test_server_and_models_are_live_and_ready_and_an_unknown_model_is_not(
    client: triton_http.InferenceServerClient,
) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tabular_mlp") and client.is_model_ready("tabular_mlp", "1")
    assert not client.is_model_ready("tabular_mlp", "7")
    assert not client.is_model_ready("no_such_model")


def test_model_metadata_equals_the_grpc_answer_with_shapes_as_numbers(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    over_http = client.get_model_metadata("multi_io")
    over_grpc = grpc_client.get_model_metadata("multi_io", as_json=True)
    assert over_http["versions"] == over_grpc["versions"] == ["1"]
    assert over_http["platform"] == over_grpc["platform"]
    for field in ("inputs", "outputs"):
        assert [(t["name"], t["datatype"], t["shape"]) for t in over_http[field]] == [
            (t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in over_grpc[field]
        ]


def test_model_config_is_the_grpc_configuration_as_triton_writes_it_in_json(
    client: triton_http.InferenceServerClient,
) -> None:
    config = client.get_model_config("tabular_mlp")
    assert config["max_batch_size"] == 4096
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("features", "TYPE_FP32", [64])
    ]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert client.get_model_config("text_hashing")["input"][0]["data_type"] == "TYPE_STRING"


def test_metadata_of_an_unknown_model_is_404_in_the_grpc_words(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    over_http = http_refusal(lambda: client.get_model_metadata("no_such_model"))
    over_grpc = http_refusal(lambda: grpc_client.get_model_metadata("no_such_model"))
    assert over_http.status() == "404"
    assert over_http.message() == over_grpc.message()


# -- inference ---------------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp32_inference_equals_the_grpc_answer(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient, binary: bool
) -> None:
    x = features(5)
    result = client.infer(
        "tabular_mlp",
        [http_input("features", x, "FP32", binary)],
        outputs=[triton_http.InferRequestedOutput("probabilities", binary_data=binary)],
        request_id="fp32",
    )
    expected = grpc_client.infer("tabular_mlp", [grpc_input("features", x, "FP32")]).as_numpy("probabilities")
    assert result.get_response()["id"] == "fp32"
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_json_and_binary_inputs_mix_and_only_the_requested_outputs_are_answered(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    rng = np.random.default_rng(3)
    numeric, category = rng.normal(size=(4, 8)).astype(np.float32), rng.integers(0, 16, 4).astype(np.int32)
    result = client.infer(
        "multi_io",
        [http_input("numeric", numeric, "FP32", True), http_input("category", category, "INT32", False)],
        outputs=[triton_http.InferRequestedOutput("embedding", binary_data=False)],
    )
    expected = grpc_client.infer(
        "multi_io", [grpc_input("numeric", numeric, "FP32"), grpc_input("category", category, "INT32")]
    ).as_numpy("embedding")
    assert [o["name"] for o in result.get_response()["outputs"]] == ["embedding"]
    np.testing.assert_allclose(result.as_numpy("embedding"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_string_input_answers_as_the_keras_model_in_process(
    client: triton_http.InferenceServerClient, example_repository: Path, binary: bool
) -> None:
    text = texts(6)
    result = client.infer("text_hashing", [http_input("text", text, "BYTES", binary)])
    expected = keras_reference(example_repository, "text_hashing", {"text": text})["probabilities"]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_string_output_comes_back_as_sent(client: triton_http.InferenceServerClient, binary: bool) -> None:
    text = np.array(["héllo".encode(), b"", "日本語".encode()], dtype=object)
    result = client.infer(
        "text_identity",
        [http_input("text", text, "BYTES", binary)],
        outputs=[triton_http.InferRequestedOutput("same", binary_data=binary)],
    )
    expected = text if binary else [value.decode() for value in text]  # JSON carries text
    np.testing.assert_array_equal(result.as_numpy("same").reshape(-1), expected)


def test_plain_json_inference_answers_the_protocol_s_json(http_server: ServerProcess) -> None:
    assert http_server.kserve_http_address is not None
    body = {
        "id": "plain-1",
        "inputs": [{"name": "features", "shape": [2, 64], "datatype": "FP32", "data": features(2).tolist()}],
    }
    status, headers, answer = raw_http(
        http_server.kserve_http_address, "POST", "/v2/models/tabular_mlp/infer", json.dumps(body).encode()
    )
    assert status == 200 and headers["content-type"] == "application/json"
    response = json.loads(answer)
    assert {k: response[k] for k in ("model_name", "model_version", "id")} == {
        "model_name": "tabular_mlp",
        "model_version": "1",
        "id": "plain-1",
    }
    (output,) = response["outputs"]
    assert (output["name"], output["datatype"], output["shape"], len(output["data"])) == (
        "probabilities",
        "FP32",
        [2, 8],
        16,
    )


def test_a_version_in_the_path_is_served_and_an_unknown_one_is_404(
    client: triton_http.InferenceServerClient,
) -> None:
    x = features(2)
    assert client.infer("tabular_mlp", [http_input("features", x, "FP32")], model_version="1").as_numpy(
        "probabilities"
    ).shape == (2, 8)
    error = http_refusal(
        lambda: client.infer("tabular_mlp", [http_input("features", x, "FP32")], model_version="7")
    )
    assert error.status() == "404" and "version 7" in error.message()


def test_compressed_requests_and_answers_are_read_and_written(
    client: triton_http.InferenceServerClient,
) -> None:
    x = features(3)
    plain = client.infer("tabular_mlp", [http_input("features", x, "FP32")])
    for algorithm in ("gzip", "deflate"):
        packed = client.infer(
            "tabular_mlp",
            [http_input("features", x, "FP32")],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(packed.as_numpy("probabilities"), plain.as_numpy("probabilities"))


# -- refusals: statuses and words of the gRPC side ---------------------------------------------
def test_a_wrong_shape_is_400_in_the_words_of_the_grpc_refusal(
    client: triton_http.InferenceServerClient, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    bad = np.zeros((3, 63), np.float32)
    over_http = http_refusal(lambda: client.infer("tabular_mlp", [http_input("features", bad, "FP32")]))
    over_grpc = http_refusal(lambda: grpc_client.infer("tabular_mlp", [grpc_input("features", bad, "FP32")]))
    assert over_http.status() == "400" and over_grpc.status() == "StatusCode.INVALID_ARGUMENT"
    assert over_http.message() == over_grpc.message()


def test_an_unknown_model_is_404_listing_the_served_models(client: triton_http.InferenceServerClient) -> None:
    error = http_refusal(lambda: client.infer("no_such_model", [http_input("features", features(1), "FP32")]))
    assert error.status() == "404" and "tabular_mlp" in error.message()


def test_json_data_of_the_wrong_kind_is_400_naming_the_input(http_server: ServerProcess) -> None:
    assert http_server.kserve_http_address is not None
    body = {"inputs": [{"name": "features", "shape": [1, 2], "datatype": "INT32", "data": [1.5, 2]}]}
    status, _, answer = raw_http(
        http_server.kserve_http_address, "POST", "/v2/models/tabular_mlp/infer", json.dumps(body).encode()
    )
    assert status == 400
    assert "input 'features'" in json.loads(answer)["error"]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps(
            {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1] * 70, "data": [0.5]}]}
        ).encode(),
        json.dumps(
            {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2**62, 2**62], "data": []}]}
        ).encode(),
        json.dumps(
            {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64], "data": [[[[0.5]]]]}]}
        ).encode(),
    ],
    ids=["nested-100000-deep", "70-dimensions", "2^124-elements", "too-deep-data"],
)
def test_a_hostile_body_is_400_and_the_server_answers_on(http_server: ServerProcess, body: bytes) -> None:
    assert http_server.kserve_http_address is not None
    status, headers, answer = raw_http(
        http_server.kserve_http_address, "POST", "/v2/models/tabular_mlp/infer", body
    )
    assert status == 400 and headers["content-type"] == "application/json"
    assert len(json.loads(answer)["error"]) <= 1000
    assert raw_http(http_server.kserve_http_address, "GET", "/v2/health/live")[0] == 200


def test_a_model_name_of_64_kib_is_answered_with_a_clipped_message(http_server: ServerProcess) -> None:
    assert http_server.kserve_http_address is not None
    status, _, answer = raw_http(http_server.kserve_http_address, "GET", "/v2/models/" + "m" * 65536)
    assert 400 <= status < 500 and len(answer) < 4096


def oversized_request_then_rest(address: str) -> tuple[bytes, str]:
    """Send a request line over h11's 16 KiB bound, wait for the server's answer to arrive, send
    256 KiB more of the same request (a client that writes its whole request before reading), end
    the request and read to the end: what was read, and how the stream ended ("eof" or "reset")."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /v2/models/" + b"m" * 20_000)
        answer = sock.recv(65536)  # blocks until the server has refused the line and answered
        try:
            sock.sendall(b"m" * 262_144 + b" HTTP/1.1\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            return answer, "reset"
    return answer, "eof"


@pytest.mark.parametrize("port", ["kserve", "admin"])
def test_a_request_line_over_the_bound_gets_its_400_read_to_a_clean_end_not_a_reset(
    http_server: ServerProcess, port: str
) -> None:
    address = http_server.kserve_http_address if port == "kserve" else http_server.http_address
    assert address is not None
    answer, ending = oversized_request_then_rest(address)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert ending == "eof", "the server reset the connection while the client was still sending its request"


def refused_connection(address: str) -> socket.socket:
    """A connection whose request line the server has refused, its 400 read to the end (the server
    stops writing after it), the connection still open from the client's side."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"GET /v2/models/" + b"m" * 20_000)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.endswith(b"Invalid HTTP request received."), answer
    return sock


def test_after_its_400_a_client_that_keeps_sending_is_cut_off(http_server: ServerProcess) -> None:
    assert http_server.kserve_http_address is not None
    with (
        refused_connection(http_server.kserve_http_address) as sock,
        pytest.raises((ConnectionResetError, BrokenPipeError)),
    ):
        for _ in range(64):  # 64 MiB: the server reads and drops at most 1 MiB after its 400
            sock.sendall(b"m" * (1 << 20))


def test_after_its_400_a_client_that_sends_nothing_more_is_closed(http_server: ServerProcess) -> None:
    assert http_server.kserve_http_address is not None
    with (
        refused_connection(http_server.kserve_http_address) as sock,
        pytest.raises((ConnectionResetError, BrokenPipeError)),
    ):
        # Once the server has closed (2 s after its 400), a byte sent is answered by a reset and
        # the next send fails; a server holding the connection would let this run to the end.
        for _ in range(300):
            sock.sendall(b"m")
            time.sleep(0.1)


def test_a_body_that_is_not_json_is_400_and_counted_as_a_refusal_of_its_model(
    http_server: ServerProcess,
) -> None:
    address, admin = http_server.kserve_http_address, http_server.http_address
    assert address is not None and admin is not None
    labels = {"model": "tabular_mlp", "code": "INVALID_ARGUMENT"}
    before = metric_value(scrape(admin), "udfserve_requests_total", **labels)
    status, _, answer = raw_http(address, "POST", "/v2/models/tabular_mlp/infer", b"{not json")
    assert status == 400 and "is not JSON" in json.loads(answer)["error"]
    assert metric_value(scrape(admin), "udfserve_requests_total", **labels) == before + 1


def test_a_full_queue_is_503_in_triton_s_words_and_the_rest_is_answered(
    http_server: ServerProcess, client: triton_http.InferenceServerClient
) -> None:
    address = http_server.kserve_http_address
    assert address is not None
    lines = np.random.default_rng(0).normal(size=(SMALL_QUEUE_ROWS, 16, 32)).astype(np.float32)
    data = lines.tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "lines",
                    "shape": list(lines.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    ).encode()

    def send(_: int) -> tuple[int, bytes]:
        headers = {"Inference-Header-Content-Length": str(len(head))}
        status, _, body = raw_http(address, "POST", "/v2/models/small_queue/infer", head + data, headers)
        return status, body

    with ThreadPoolExecutor(64) as senders:  # requests in flight together, as perf_analyzer's
        received = list(senders.map(send, range(120)))
    refused = [json.loads(body)["error"] for status, body in received if status != 200]
    assert refused and len(refused) < 120
    assert {status for status, _ in received} == {200, 503}
    assert all(message.startswith("Exceeds maximum queue size") for message in refused)
    retried = client.infer("small_queue", [http_input("lines", lines, "FP32")])
    assert retried.as_numpy("class_probabilities").shape == (SMALL_QUEUE_ROWS, 4)


def test_system_shared_memory_is_served_its_status_listing_the_registered_regions(
    client: triton_http.InferenceServerClient,
) -> None:
    assert client.get_system_shared_memory_status() == []  # test_kserve_shared_memory.py: the rest


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v2/cudasharedmemory/status", 501),
        ("GET", "/v2/trace/setting", 501),
        ("POST", "/v2/logging", 501),
        ("GET", "/v2/no/such/route", 404),
        ("GET", "/v2/models/tabular_mlp/infer", 405),
    ],
)
def test_routes_not_served_answer_their_status_in_json(
    http_server: ServerProcess, method: str, path: str, status: int
) -> None:
    assert http_server.kserve_http_address is not None
    received, headers, body = raw_http(
        http_server.kserve_http_address, method, path, b"" if method == "POST" else None
    )
    assert received == status and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]


def test_a_body_declared_over_the_message_limit_is_refused_413_before_it_is_sent(
    http_server: ServerProcess,
) -> None:
    assert http_server.kserve_http_address is not None
    host, port = http_server.kserve_http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/tabular_mlp/infer")
        connection.putheader("Content-Length", str(1 << 40))
        connection.endheaders()  # the body never follows: the answer must not wait for it
        response = connection.getresponse()
        assert response.status == 413
        assert "--max-message-bytes" in json.loads(response.read())["error"]
    finally:
        connection.close()


# -- the same counts as the gRPC side ----------------------------------------------------------
def test_statistics_and_metrics_count_http_requests_with_grpc_ones(
    client: triton_http.InferenceServerClient,
    grpc_client: triton_grpc.InferenceServerClient,
    http_server: ServerProcess,
) -> None:
    assert http_server.http_address is not None

    def success_count() -> int:
        (stats,) = client.get_inference_statistics("tabular_mlp")["model_stats"]
        return int(stats["inference_stats"]["success"]["count"])

    before, rows_before = (
        success_count(),
        metric_value(scrape(http_server.http_address), "udfserve_rows_total"),
    )
    client.infer("tabular_mlp", [http_input("features", features(7), "FP32")])
    grpc_client.infer("tabular_mlp", [grpc_input("features", features(3), "FP32")])
    assert success_count() == before + 2
    assert metric_value(scrape(http_server.http_address), "udfserve_rows_total") == rows_before + 10
    (over_grpc,) = grpc_client.get_inference_statistics("tabular_mlp").model_stats
    assert over_grpc.inference_stats.success.count == before + 2


def test_spark_headers_count_a_request_for_its_application(
    client: triton_http.InferenceServerClient, http_server: ServerProcess
) -> None:
    assert http_server.http_address is not None
    spark = {"udfserve-spark-app-id": "app-http-0001", "udfserve-spark-app-name": "http scoring"}
    client.infer("tabular_mlp", [http_input("features", features(4), "FP32")], headers=spark)
    status, body = http_json(http_server.http_address, "/v1/spark/applications")
    assert status == 200
    [app] = [a for a in body["applications"] if a["app_id"] == "app-http-0001"]  # type: ignore[index]
    assert (app["app_name"], app["rows"], app["requests"]) == ("http scoring", 4, 1)


# -- a server with a token, a small message limit and explicit model control -------------------
@pytest.fixture(scope="module")
def guarded_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The tabular model's ONNX graph: the token, the body limit and the repository routes are the
    server's, whatever backend computes (a start without TensorFlow's import)."""
    repository = tmp_path_factory.mktemp("kserve-http-guarded")
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    process = launch_server(
        repository,
        socket=socket_dir / "kserve-http-guarded.sock",
        log_path=repository.parent / "kserve-http-guarded.log",
        extra_args=[
            "--kserve-http-port",
            "0",
            "--auth-token",
            TOKEN,
            "--max-message-bytes",
            str(1 << 16),
            "--model-control",
            "explicit",
        ],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def guarded(guarded_server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    assert guarded_server.kserve_http_address is not None
    with triton_http.InferenceServerClient(guarded_server.kserve_http_address) as http_client:
        yield http_client


AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


def test_without_the_token_inference_and_metadata_are_401_and_health_is_open(
    guarded: triton_http.InferenceServerClient,
) -> None:
    assert guarded.is_server_live() and guarded.is_server_ready()
    for call in (
        lambda: guarded.get_server_metadata(),
        lambda: guarded.infer("tabular_mlp", [http_input("features", features(1), "FP32")]),
    ):
        error = http_refusal(call)
        assert error.status() == "401" and "Authorization: Bearer <token>" in error.message()
    result = guarded.infer("tabular_mlp", [http_input("features", features(2), "FP32")], headers=AUTHORIZED)
    assert result.as_numpy("probabilities").shape == (2, 8)


def test_a_body_over_the_message_limit_is_413_naming_the_limit(
    guarded: triton_http.InferenceServerClient,
) -> None:
    too_many = features(300)  # 76,800 bytes of binary data
    error = http_refusal(
        lambda: guarded.infer("tabular_mlp", [http_input("features", too_many, "FP32")], headers=AUTHORIZED)
    )
    assert error.status() == "413" and "limit of 65536 bytes" in error.message()


def test_a_gzip_body_that_grows_past_the_limit_is_413(guarded_server: ServerProcess) -> None:
    assert guarded_server.kserve_http_address is not None
    head = json.dumps(
        {"inputs": [{"name": "features", "shape": [400, 64], "datatype": "FP32", "data": [0.0] * 400 * 64}]}
    ).encode()
    status, _, body = raw_http(
        guarded_server.kserve_http_address,
        "POST",
        "/v2/models/tabular_mlp/infer",
        gzip.compress(head),
        {**AUTHORIZED, "Content-Encoding": "gzip"},
    )
    assert status == 413 and "once decompressed" in json.loads(body)["error"]


def test_the_repository_routes_index_unload_and_load_a_model(
    guarded: triton_http.InferenceServerClient,
) -> None:
    index = guarded.get_model_repository_index(headers=AUTHORIZED)
    assert [(m["name"], m["version"], m["state"]) for m in index] == [("tabular_mlp", "1", "READY")]
    guarded.unload_model("tabular_mlp", headers=AUTHORIZED)
    assert not guarded.is_model_ready("tabular_mlp", headers=AUTHORIZED)
    guarded.load_model("tabular_mlp", headers=AUTHORIZED)
    assert guarded.is_model_ready("tabular_mlp", headers=AUTHORIZED)


def test_a_load_with_model_files_is_refused_400_in_the_grpc_words(
    guarded: triton_http.InferenceServerClient, guarded_server: ServerProcess
) -> None:
    error = http_refusal(
        lambda: guarded.load_model("tabular_mlp", headers=AUTHORIZED, files={"file:1/model.onnx": b"\x00"})
    )
    assert error.status() == "400"
    assert "udfserve loads models only from its repository" in error.message()


# -- stopping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("placement", ["serving", "own"])
def test_on_sigterm_the_server_exits_0_and_the_port_closes(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path: Path, placement: str
) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    process = launch_server(
        repository,
        socket=socket_dir / f"kserve-http-stop-{placement}.sock",
        log_path=tmp_path / "server.log",
        extra_args=["--kserve-http-port", "0", "--kserve-http-loop", placement],
    )
    try:
        address = process.kserve_http_address
        assert address is not None
        with triton_http.InferenceServerClient(address) as http_client:
            answered = http_client.infer("tabular_mlp", [http_input("features", features(2), "FP32")])
        assert answered.as_numpy("probabilities").shape == (2, 8)
    finally:
        assert process.terminate() == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}/v2/health/live", timeout=5)
