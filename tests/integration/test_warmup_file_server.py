"""A version folder that carries ``warmup.json`` is warmed up with its samples by a real server:
a graph casting strings to numbers (which refuses the empty strings of the synthetic warm-up)
loads without a warning and answers; a version whose file names a sample the model refuses, or
whose file is over the bound, fails its load naming the file from the repository down while the
version beside it keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from onnx_graphs import casting_graph
from server_harness import http_json, request, stream_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.runtime.warmup_file import MAX_WARMUP_FILE_BYTES, WARMUP_FILE_NAME
from udfserve.services.model_server.launcher import ServerProcess, launch_server

CASTING = "casting_file"
VERSIONED = "casting_versions"
HOSTILE = "casting_hostile"
TAKEN = {"samples": [{"text": [["1.5"], ["-2"]]}]}
REFUSED = {"samples": [{"text": [["1.5"]]}, {"text": [["one"]]}]}


def write_version(root: Path, name: str, version: int, warmup: str) -> None:
    """``root/name/<version>/`` holding the casting graph and ``warmup`` as its warm-up file."""
    version_dir = root / name / str(version)
    version_dir.mkdir(parents=True)
    (version_dir / "model.onnx").write_bytes(casting_graph().SerializeToString())
    (version_dir / WARMUP_FILE_NAME).write_text(warmup, encoding="utf-8")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup-file") / "repository"
    write_version(root, CASTING, 1, json.dumps(TAKEN))
    write_version(root, VERSIONED, 1, json.dumps(TAKEN))
    write_version(root, VERSIONED, 2, json.dumps(REFUSED))
    (root / VERSIONED / "config.yaml").write_text("version_policy: {all: true}\n", encoding="utf-8")
    write_version(root, HOSTILE, 1, " " * (MAX_WARMUP_FILE_BYTES + 1))
    return root


@pytest.fixture(scope="module")
def server(repository: Path, socket_dir: Path) -> Iterator[ServerProcess]:
    process = launch_server(
        repository, socket=socket_dir / "warmup-file.sock", log_path=repository.parent / "server.log"
    )
    yield process
    process.terminate()


def metadata(server: ServerProcess, model: str) -> pb.ModelMetadata:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        return pb_grpc.InferenceStub(channel).GetModelMetadata(
            pb.ModelMetadataRequest(model=model), timeout=30
        )


def cast(server: ServerProcess, model: str, texts: list[str], version: int = 0) -> np.ndarray:
    column = pa.FixedSizeListArray.from_arrays(pa.array(texts, pa.string()), 1)
    batch = pa.record_batch({"text": column})
    answer = stream_predict(server.grpc_target(), [request(model, batch, version=version)])[0]
    assert answer.code == grpc.StatusCode.OK, answer.message
    assert answer.outputs is not None
    return answer.outputs.column("value").flatten().to_numpy()


def test_a_version_carrying_its_samples_loads_without_a_warning_and_answers(
    server: ServerProcess, repository: Path
) -> None:
    log = (repository.parent / "server.log").read_text(encoding="utf-8")

    assert metadata(server, CASTING).state == pb.MODEL_STATE_READY
    assert not any(f"model '{CASTING}'" in line for line in log.splitlines() if "warm-up" in line)
    np.testing.assert_array_equal(cast(server, CASTING, ["4", " 7 "]), [4.0, 7.0])


def test_a_sample_of_the_file_the_model_refuses_fails_only_that_version_naming_the_file(
    server: ServerProcess, repository: Path
) -> None:
    info = metadata(server, VERSIONED)

    assert info.state == pb.MODEL_STATE_READY and list(info.served_versions) == [1]
    assert f"{VERSIONED}/2/{WARMUP_FILE_NAME}" in info.error
    assert "sample 1" in info.error and str(repository.resolve()) not in info.error
    np.testing.assert_array_equal(cast(server, VERSIONED, ["2.5"], version=1), [2.5])


def test_a_file_over_the_bound_fails_the_load_naming_the_file_and_the_bound(server: ServerProcess) -> None:
    _, listed = http_json(str(server.http_address), "/v1/models")

    error = next(entry["error"] for entry in listed if entry["name"] == HOSTILE)  # type: ignore[union-attr]
    assert f"{HOSTILE}/1/{WARMUP_FILE_NAME}" in error
    assert f"expected at most {MAX_WARMUP_FILE_BYTES} bytes" in error
    assert metadata(server, CASTING).state == pb.MODEL_STATE_READY
