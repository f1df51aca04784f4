"""A real server labels work by Spark application, within a documented bound."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from server_harness import batch_of, http_json, metric_value, request, scrape

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server

MAX_TRACKED_APPS = 8


@pytest.fixture(scope="module")
def app_server(tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "apps.sock",
        extra_args=["--models", "tabular_mlp", "--max-tracked-apps", str(MAX_TRACKED_APPS)],
        log_path=tmp_path_factory.mktemp("apps") / "server.log",
    )
    yield process
    process.terminate()


def stream_with_metadata(
    server: ServerProcess, metadata: list[tuple[str, str | bytes]], rows: int, batches: int
):
    batch = batch_of({"features": np.ones((rows, 64), np.float32)})
    with grpc.insecure_channel(server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        replies = list(
            stub.Predict(
                iter([request("tabular_mlp", batch, i) for i in range(batches)]),
                metadata=metadata,
                timeout=60,
            )
        )
    assert all(not r.HasField("error") for r in replies)
    return replies


def spark_metadata(app_id: str, app_name: str) -> list[tuple[str, str | bytes]]:
    return [
        ("udfserve-spark-app-id", app_id),
        ("udfserve-spark-app-name", app_name),
        ("udfserve-spark-stage-id", "3"),
        ("udfserve-spark-partition-id", "7"),
    ]


def test_an_application_appears_in_metrics_and_the_admin_listing_with_its_rows(
    app_server: ServerProcess,
) -> None:
    stream_with_metadata(
        app_server, spark_metadata("app-20261122-0001", "nightly scoring"), rows=25, batches=4
    )
    metrics = scrape(app_server.http_address or "")
    assert (
        metric_value(
            metrics, "udfserve_app_rows_total", app_id="app-20261122-0001", app_name="nightly scoring"
        )
        == 100
    )
    status, body = http_json(app_server.http_address or "", "/v1/spark/applications")
    assert status == 200
    [app] = [a for a in body["applications"] if a["app_id"] == "app-20261122-0001"]
    assert (app["app_name"], app["rows"], app["requests"], app["errors"]) == ("nightly scoring", 100, 4, 0)
    assert app["models"] == ["tabular_mlp"]


@pytest.mark.slow
def test_hostile_metadata_never_grows_the_series_or_memory_beyond_the_bound(
    app_server: ServerProcess,
) -> None:
    server_process = psutil.Process(app_server.pid)
    stream_with_metadata(app_server, spark_metadata("warm-up", "warm-up"), rows=1, batches=1)
    rss_before = server_process.memory_info().rss
    # gRPC itself only carries printable ASCII in text metadata; binary goes in "-bin" keys.
    hostile = [
        [("udfserve-spark-app-id", "x" * 3000), ("udfserve-spark-app-name", "y" * 3000)],
        [("udfserve-spark-app-id-bin", b"\x00\xff" * 100), ("udfserve-spark-stage-id", "4; DROP TABLE")],
    ]
    for metadata in hostile:
        stream_with_metadata(app_server, metadata, rows=1, batches=1)
    for i in range(500):
        stream_with_metadata(app_server, spark_metadata(f"app-hostile-{i}", f"name-{i}"), rows=1, batches=1)
    metrics = scrape(app_server.http_address or "")
    app_ids = set(re.findall(r'app_id="([^"]*)"', metrics))
    assert len(app_ids) == MAX_TRACKED_APPS
    assert "x" * 200 not in metrics
    _, body = http_json(app_server.http_address or "", "/v1/spark/applications")
    assert len(body["applications"]) == MAX_TRACKED_APPS and body["evicted"] >= 500 - MAX_TRACKED_APPS
    growth_mib = (server_process.memory_info().rss - rss_before) / 2**20
    assert growth_mib < 64, f"the server grew by {growth_mib:.0f} MiB over 500 distinct applications"
