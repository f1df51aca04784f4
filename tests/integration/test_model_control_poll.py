"""``--model-control poll``: versions published, broken, reconfigured and removed while a server
runs, against a real server process and real TensorFlow models.

Each test has a server of its own on a copy of ``tabular_mlp`` (version 1), and publishes
versions the documented way: written into a hidden folder of the model, then renamed. Version 2
has other weights than version 1 (``models generate --publish-version 2``).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.server_harness import (
    Answer,
    batch_of,
    column_to_numpy,
    http_json,
    metric_value,
    request,
    running_server,
    scrape,
    stream_predict,
)
from tests.node.node_harness import wait_until
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch
from udfserve.services.model_server.launcher import ServerProcess

MODEL = "tabular_mlp"
POLL_ARGS = [
    *("--model-control", "poll", "--repository-poll-s", "0.2", "--repository-settle-s", "1"),
    *(
        "--version-lease-s",
        "1",
    ),  # a replaced version leased briefly: tests/integration/test_version_leases.py
]
ROWS = 64
FEATURES = np.random.default_rng(7).normal(size=(ROWS, 64)).astype(np.float32)


@pytest.fixture
def repository(tabular_repository: Path) -> Path:
    return tabular_repository


@pytest.fixture
def poll_server(
    repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[ServerProcess]:
    extra = getattr(request, "param", [])
    with running_server(repository, socket_dir, tmp_path_factory, "poll", [*POLL_ARGS, *extra]) as server:
        yield server


def publish(source: Path, model_dir: Path, version: int) -> None:
    """Copy ``source`` in as version ``version``: into a hidden folder, then renamed."""
    staging = model_dir / f".{version}.incoming"
    shutil.copytree(source, staging)
    staging.rename(model_dir / str(version))


def predict(server: ServerProcess, version: int = 0) -> Answer:
    (answer,) = stream_predict(
        f"unix://{server.unix_socket}", [request(MODEL, batch_of({"features": FEATURES}), version=version)]
    ).values()
    return answer


def answered_version(server: ServerProcess) -> int:
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        responses = pb_grpc.InferenceStub(channel).Predict(
            iter([request(MODEL, batch_of({"features": FEATURES}))]), timeout=60
        )
        (response,) = list(responses)
    assert not response.HasField("error"), response.error.message
    return response.model_version


def metadata(server: ServerProcess) -> pb.ModelMetadata:
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        return pb_grpc.InferenceStub(channel).GetModelMetadata(
            pb.ModelMetadataRequest(model=MODEL), timeout=30
        )


class SteadyClient:
    """Sends small streams of requests naming no version, one after the other, until stopped;
    keeps every answer (its status and the version that computed it)."""

    def __init__(self, server: ServerProcess) -> None:
        self._target = f"unix://{server.unix_socket}"
        self._stop = threading.Event()
        self.answers: list[tuple[grpc.StatusCode, str, int, np.ndarray | None]] = []
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SteadyClient:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def versions(self) -> set[int]:
        return {version for code, _, version, _ in self.answers if code is grpc.StatusCode.OK}

    def _run(self) -> None:
        with grpc.insecure_channel(self._target) as channel:
            stub = pb_grpc.InferenceStub(channel)
            while not self._stop.is_set():
                requests = [request(MODEL, batch_of({"features": FEATURES}), batch_id=i) for i in range(8)]
                self.sent += len(requests)
                # A stream answers in completion order: a request resolved to version 1 just before the
                # switch can finish after one resolved to version 2. Kept in the order they were sent
                # (and so admitted: one stream at a time), the versions must switch once.
                stream_answers = sorted(stub.Predict(iter(requests), timeout=120), key=lambda r: r.batch_id)
                for response in stream_answers:
                    if response.HasField("error"):
                        code = next(c for c in grpc.StatusCode if c.value[0] == response.error.code)
                        self.answers.append((code, response.error.message, 0, None))
                    else:
                        outputs = column_to_numpy(decode_batch(response.arrow_ipc).column(0))
                        self.answers.append((grpc.StatusCode.OK, "", response.model_version, outputs))


def test_a_version_published_while_requests_flow_takes_over_and_no_request_fails(
    poll_server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    before = predict(poll_server)
    assert before.outputs is not None
    with SteadyClient(poll_server) as client:
        wait_until(lambda: client.answers or None, 120, "the first answers")
        publish(tabular_onnx_version_2, repository / MODEL, 2)
        wait_until(lambda: 2 in client.versions() or None, 120, "answers computed by version 2")
        seen = len(client.answers)
        wait_until(lambda: len(client.answers) >= seen + 16 or None, 120, "answers after the switch")

    assert [a for a in client.answers if a[0] is not grpc.StatusCode.OK] == []
    assert len(client.answers) == client.sent
    assert client.versions() == {1, 2}
    first_2 = next(i for i, a in enumerate(client.answers) if a[2] == 2)
    assert all(a[2] == 2 for a in client.answers[first_2:]), (
        "a request named no version, sent after one that got version 2, got version 1"
    )
    after = predict(poll_server)
    assert after.outputs is not None
    v1, v2 = column_to_numpy(before.outputs.column(0)), column_to_numpy(after.outputs.column(0))
    assert not np.allclose(v1, v2), "version 2 must compute other predictions than version 1"
    for _, _, version, outputs in client.answers:
        np.testing.assert_allclose(outputs, v1 if version == 1 else v2, rtol=1e-5, atol=1e-6)


def test_a_published_version_is_counted_in_the_lifecycle_metrics(
    poll_server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    publish(tabular_onnx_version_2, repository / MODEL, 2)
    wait_until(lambda: answered_version(poll_server) == 2 or None, 120, "version 2 serving")

    def unloaded() -> str | None:
        text = scrape(str(poll_server.http_address))
        return text if metric_value(text, "udfserve_model_unloads_total", model=MODEL, version="1") else None

    text = wait_until(unloaded, 120, "version 1 unloaded")
    assert metric_value(text, "udfserve_model_loads_total", model=MODEL, version="1") == 1
    assert metric_value(text, "udfserve_model_loads_total", model=MODEL, version="2") == 1
    assert metric_value(text, "udfserve_model_ready", model=MODEL, version="2") == 1
    assert metric_value(text, "udfserve_model_ready", model=MODEL, version="1") == 0
    assert metric_value(text, "udfserve_model_load_duration_seconds", model=MODEL, version="2") > 0
    assert list(metadata(poll_server).served_versions) == [2]


def test_a_broken_version_leaves_the_old_one_serving_and_says_why_in_metadata_health_and_metrics(
    poll_server: ServerProcess, repository: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(repository / MODEL / "1", broken)
    artifact = broken / "model.onnx"
    artifact.write_bytes(artifact.read_bytes()[: artifact.stat().st_size // 2])  # a truncated copy

    with SteadyClient(poll_server) as client:
        publish(broken, repository / MODEL, 3)
        wait_until(lambda: "version 3" in metadata(poll_server).error or None, 120, "the failure in metadata")
        seen = len(client.answers)
        wait_until(lambda: len(client.answers) >= seen + 8 or None, 120, "answers after the failure")

    assert [a for a in client.answers if a[0] is not grpc.StatusCode.OK] == []
    assert client.versions() == {1}
    info = metadata(poll_server)
    assert info.state == pb.MODEL_STATE_READY and list(info.served_versions) == [1]
    assert f"{MODEL}/3/" in info.error and str(repository.resolve()) not in info.error  # no server path
    status, readiness = http_json(str(poll_server.http_address), "/health/ready")
    assert status == 200 and isinstance(readiness, dict)
    assert "version 3" in readiness["failed"][MODEL]
    assert readiness["versions"] == {MODEL: [1]}
    text = scrape(str(poll_server.http_address))
    assert metric_value(text, "udfserve_model_load_failures_total", model=MODEL, version="3") == 1
    assert metric_value(text, "udfserve_model_ready", model=MODEL, version="1") == 1


def test_a_changed_config_loads_the_served_version_again_with_it(
    poll_server: ServerProcess, repository: Path
) -> None:
    config = repository / MODEL / "config.yaml"
    config.write_text(config.read_text().replace("max_batch_size: 4096", "max_batch_size: 2048"))

    wait_until(lambda: metadata(poll_server).max_batch_size == 2048 or None, 120, "the new config in force")
    assert predict(poll_server).code is grpc.StatusCode.OK
    assert metric_value(scrape(str(poll_server.http_address)), "udfserve_model_loads_total", version="1") == 2


def test_a_model_removed_from_the_repository_unloads_and_its_requests_get_not_found(
    poll_server: ServerProcess, repository: Path, tmp_path: Path
) -> None:
    (repository / MODEL).rename(tmp_path / "moved-away")

    wait_until(
        lambda: metadata(poll_server).state == pb.MODEL_STATE_UNLOADED or None, 120, "the model unloaded"
    )
    answer = predict(poll_server)
    assert answer.code is grpc.StatusCode.NOT_FOUND
    assert "unloaded" in answer.message


@pytest.mark.parametrize("poll_server", [["--version-swap", "unload-first"]], indirect=True)
def test_unload_first_refuses_with_back_off_while_it_swaps_and_never_fails_a_request(
    poll_server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    with SteadyClient(poll_server) as client:
        wait_until(lambda: client.answers or None, 120, "the first answers")
        publish(tabular_onnx_version_2, repository / MODEL, 2)
        wait_until(lambda: 2 in client.versions() or None, 120, "answers computed by version 2")

    refusals = {(code, message) for code, message, _, _ in client.answers if code is not grpc.StatusCode.OK}
    assert {code for code, _ in refusals} <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("switching versions" in message for _, message in refusals)
    assert client.versions() == {1, 2}


def test_a_version_policy_serves_several_versions_and_a_request_pinning_one_gets_it(
    repository: Path, tabular_onnx_version_2: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    publish(tabular_onnx_version_2, repository / MODEL, 2)
    config = repository / MODEL / "config.yaml"
    config.write_text(config.read_text() + "version_policy: {latest: 2}\n")

    with running_server(repository, socket_dir, tmp_path_factory, "policy") as server:
        pinned = {
            version: stream_predict(
                f"unix://{server.unix_socket}",
                [request(MODEL, batch_of({"features": FEATURES}), version=version)],
            )[0]
            for version in (1, 2)
        }
        assert answered_version(server) == 2
        assert list(metadata(server).served_versions) == [1, 2]
        absent = predict(server, version=5)

    assert all(answer.code is grpc.StatusCode.OK for answer in pinned.values())
    assert pinned[1].outputs is not None and pinned[2].outputs is not None
    assert not np.allclose(
        column_to_numpy(pinned[1].outputs.column(0)), column_to_numpy(pinned[2].outputs.column(0))
    )
    assert absent.code is grpc.StatusCode.NOT_FOUND
    assert "serves version 1, 2" in absent.message
