"""The HTTP admin app and the Prometheus metrics of a real server process."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import urllib.request
from email.message import Message
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import batch_of, http_json, metric_value, request, scrape, stream_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server

SERVING_METRICS = (
    "udfserve_requests_total",
    "udfserve_request_duration_seconds_bucket",
    "udfserve_queue_wait_seconds_bucket",
    "udfserve_batch_size_rows_bucket",
    "udfserve_rows_total",
    "udfserve_requests_in_flight",
    "udfserve_inference_duration_seconds_bucket",
    "udfserve_model_loads_total",
    "udfserve_model_ready",
    "udfserve_server_info",
)


def test_metrics_are_exposed_in_prometheus_text_and_move_with_requests(server: ServerProcess) -> None:
    before = scrape(server.http_address or "")
    rows = 37
    batch = batch_of({"features": np.ones((rows, 64), np.float32)})
    stream_predict(server.grpc_target(), [request("tabular_mlp", batch, i) for i in range(3)])
    stream_predict(server.grpc_target(), [request("tabular_mlp", b"junk", 9)])
    after = scrape(server.http_address or "")
    for name in SERVING_METRICS:
        assert name in after, name

    def moved(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert moved("udfserve_requests_total", model="tabular_mlp", code="OK") == 3
    assert moved("udfserve_requests_total", model="tabular_mlp", code="INVALID_ARGUMENT") == 1
    assert moved("udfserve_rows_total", model="tabular_mlp") == 3 * rows
    assert moved("udfserve_request_duration_seconds_count", model="tabular_mlp") == 4
    assert moved("udfserve_queue_wait_seconds_count", model="tabular_mlp") == 3
    assert moved("udfserve_batch_size_rows_sum", model="tabular_mlp") == 3 * rows
    assert metric_value(after, "udfserve_requests_in_flight", model="tabular_mlp") == 0


def test_a_refused_request_counts_for_the_model_it_names_and_only_other_names_as_unknown(
    server: ServerProcess,
) -> None:
    before = scrape(server.http_address or "")
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    answers = stream_predict(
        server.grpc_target(),
        [request("tabular_mlp", batch, 0, version=9), request("no_such_model", batch, 1)],
    )
    assert [answers[0].code, answers[1].code] == [grpc.StatusCode.NOT_FOUND] * 2
    after = scrape(server.http_address or "")

    def moved(model: str) -> float:
        labels = {"model": model, "code": "NOT_FOUND"}
        return metric_value(after, "udfserve_requests_total", **labels) - metric_value(
            before, "udfserve_requests_total", **labels
        )

    assert moved("tabular_mlp") == 1
    assert moved("<unknown>") == 1


def get_metrics(http_address: str, accept_encoding: str | None) -> tuple[Message, bytes]:
    """The answer's headers (names in any case) and body."""
    headers = {"Accept-Encoding": accept_encoding} if accept_encoding else {}
    request = urllib.request.Request(f"http://{http_address}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers, response.read()


def test_a_scraper_that_accepts_gzip_gets_the_page_compressed(server: ServerProcess) -> None:
    headers, body = get_metrics(server.http_address or "", "gzip, identity;q=0.5")  # as Prometheus asks

    assert headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    families = {family.name for family in text_string_to_metric_families(gzip.decompress(body).decode())}
    assert {"udfserve_requests", "udfserve_queue_wait_seconds", "udfserve_server_info"} <= families


def test_the_compressed_page_is_a_fraction_of_the_plain_one(server: ServerProcess) -> None:
    _, compressed = get_metrics(server.http_address or "", "gzip")
    _, plain = get_metrics(server.http_address or "", None)

    assert len(compressed) * 4 < len(plain), (len(compressed), len(plain))


def test_a_scraper_that_does_not_accept_gzip_gets_plain_text(server: ServerProcess) -> None:
    headers, body = get_metrics(server.http_address or "", None)

    assert "Content-Encoding" not in headers
    assert "udfserve_server_info" in {family.name for family in text_string_to_metric_families(body.decode())}


def test_liveness_answers_with_the_device(server: ServerProcess) -> None:
    status, body = http_json(server.http_address or "", "/health/live")
    assert status == 200
    assert body["status"] == "alive" and body["device"] == "cpu"


def test_readiness_is_ok_once_every_model_loaded(server: ServerProcess) -> None:
    status, body = http_json(server.http_address or "", "/health/ready")
    assert status == 200 and body["ready"] is True
    assert body["models"]["tabular_mlp"] == "ready" and body["failed"] == {}


def test_model_metadata_over_http_names_inputs_outputs_and_limits(server: ServerProcess) -> None:
    status, body = http_json(server.http_address or "", "/v1/models/multi_io")
    assert status == 200
    assert {i["name"]: (i["dtype"], i["shape"]) for i in body["inputs"]} == {
        "numeric": ("float32", [8]),
        "category": ("int32", []),
    }
    assert {o["name"]: o["shape"] for o in body["outputs"]} == {"score": [], "embedding": [4]}
    assert body["max_batch_size"] == 512 and body["device"] == "cpu" and body["version"] == 1


def test_unknown_model_metadata_over_http_is_404(server: ServerProcess) -> None:
    status, body = http_json(server.http_address or "", "/v1/models/nothing_here")
    assert status == 404 and "nothing_here" in body["detail"]


def test_model_listing_over_grpc_reports_every_model_ready(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        listing = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=10)
    states = {m.name: m.state for m in listing.models}
    assert states == dict.fromkeys(
        ["multi_io", "sequence_bilstm", "tabular_mlp", "tabular_mlp_savedmodel", "text_hashing"],
        pb.MODEL_STATE_READY,
    )


def test_unknown_model_metadata_over_grpc_is_not_found(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target()) as channel, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.InferenceStub(channel).GetModelMetadata(pb.ModelMetadataRequest(model="nope"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.fixture(scope="module")
def server_with_a_broken_model(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
):
    repository = tmp_path_factory.mktemp("repo-with-broken-model")
    shutil.copytree(example_repository / "tabular_mlp", repository / "tabular_mlp")
    broken = repository / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.keras").write_bytes(b"this is not a keras file")
    process = launch_server(
        repository, socket=socket_dir / "broken.sock", log_path=repository.parent / "broken-server.log"
    )
    yield process
    process.terminate()


def test_a_model_that_fails_to_load_leaves_the_others_serving(server_with_a_broken_model) -> None:
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    answers = stream_predict(
        server_with_a_broken_model.grpc_target(),
        [request("tabular_mlp", batch, 0), request("broken", batch, 1)],
    )
    assert answers[0].code == grpc.StatusCode.OK
    assert answers[1].code == grpc.StatusCode.UNAVAILABLE
    assert "broken" in answers[1].message and "model.keras" in answers[1].message


def test_requests_to_a_model_that_failed_to_load_count_for_it(server_with_a_broken_model) -> None:
    address = server_with_a_broken_model.http_address or ""
    before = metric_value(scrape(address), "udfserve_requests_total", model="broken", code="UNAVAILABLE")
    batch = batch_of({"features": np.ones((2, 64), np.float32)})
    stream_predict(server_with_a_broken_model.grpc_target(), [request("broken", batch, 0)])
    after = metric_value(scrape(address), "udfserve_requests_total", model="broken", code="UNAVAILABLE")
    assert after - before == 1


def test_readiness_and_metadata_say_which_model_failed_and_why(server_with_a_broken_model) -> None:
    address = server_with_a_broken_model.http_address
    status, body = http_json(address, "/health/ready")
    assert status == 200 and body["models"] == {"broken": "failed", "tabular_mlp": "ready"}
    assert "model.keras" in body["failed"]["broken"]
    status, meta = http_json(address, "/v1/models/broken")
    assert meta["state"] == "failed" and "model.keras" in meta["error"]


def test_readiness_names_failed_files_relative_to_the_repository(server_with_a_broken_model) -> None:
    """Health is open to anyone who reaches the port: it tells which file failed, not where the
    server keeps its files."""
    status, body = http_json(server_with_a_broken_model.http_address, "/health/ready")
    assert status == 200
    assert "broken/1/model.keras" in body["failed"]["broken"]
    assert not re.search(r"(^|[\s'\"(])/[\w.-]+/", json.dumps(body)), body
