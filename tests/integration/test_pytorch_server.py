"""A real server of a repository holding nothing but ``m/1/model.pt2`` (a model no example uses,
no config.yaml) answers over the Arrow protocol and KServe with torch's own numbers, and tells
a client's bad input as INVALID_ARGUMENT; one server serves a PyTorch model beside a Keras one;
a zip bomb beside the model fails its load with the reason, unpacked by no one, and the model
serves."""

from __future__ import annotations

import logging
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from server_harness import batch_of, column_to_numpy, http_json, request, running_server, stream_predict
from torch_programs import CLASSES, IMAGE_SHAPE, conv_net_repository, export_conv_net, torch_outputs
from zip_bombs import deflated_zeros, with_entry_replaced

from udfserve.services.examples.torch_models import TORCH_EXAMPLE, generate_torch_examples
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)
pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
BOMB_BYTES = 1900 << 20
"""What the bomb's weight entry unpacks to: 1.9 GB of zeros, a file of 1.9 MB."""


@pytest.fixture(scope="module")
def program_only_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = conv_net_repository(tmp_path_factory.mktemp("torch-repo"))
    assert sorted(str(path.relative_to(repository)) for path in repository.rglob("*")) == [
        "m",
        "m/1",
        "m/1/model.pt2",
    ]
    return repository


@pytest.fixture(scope="module")
def torch_server(
    program_only_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        program_only_repository, socket_dir, tmp_path_factory, "torch", port=0, http_port=0
    ) as process:
        yield process


def inputs(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {
        "image": rng.standard_normal((rows, *IMAGE_SHAPE)).astype(np.float32),
        "offset": rng.integers(0, 5, size=rows).astype(np.int64),
    }


@pytest.mark.parametrize("rows", [1, 300])
def test_arrow_answers_equal_torchs_in_process(
    torch_server: ServerProcess, program_only_repository: Path, rows: int
) -> None:
    given = inputs(rows)
    answer = stream_predict(torch_server.grpc_target(), [request("m", batch_of(given))])[0]
    assert answer.outputs is not None, answer.message
    expected = torch_outputs(program_only_repository / "m" / "1" / "model.pt2", given)
    assert answer.outputs.schema.names == ["probabilities", "energy"]
    np.testing.assert_allclose(
        column_to_numpy(answer.outputs.column("probabilities")), expected["probabilities"], atol=TOLERANCE
    )
    np.testing.assert_allclose(
        column_to_numpy(answer.outputs.column("energy")), expected["energy"], atol=TOLERANCE
    )


def test_kserve_metadata_gives_the_programs_inputs_and_outputs(torch_server: ServerProcess) -> None:
    """Per-row scalars are advertised as [-1, 1], as for every backend."""
    with triton.InferenceServerClient(torch_server.kserve_target()) as client:
        metadata = client.get_model_metadata("m", as_json=True)
    assert metadata["platform"] == "pytorch_export"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("image", "FP32", ["-1", *(str(dim) for dim in IMAGE_SHAPE)]),
        ("offset", "INT64", ["-1", "1"]),
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [
        ("probabilities", "FP32", ["-1", str(CLASSES)]),
        ("energy", "FP32", ["-1", "1"]),
    ]


def test_kserve_answers_equal_torchs_in_process(
    torch_server: ServerProcess, program_only_repository: Path
) -> None:
    given = inputs(64)
    with triton.InferenceServerClient(torch_server.kserve_target()) as client:
        infer_inputs = [
            triton.InferInput("image", list(given["image"].shape), "FP32").set_data_from_numpy(
                given["image"]
            ),
            triton.InferInput("offset", list(given["offset"].shape), "INT64").set_data_from_numpy(
                given["offset"]
            ),
        ]
        result = client.infer("m", infer_inputs)
    expected = torch_outputs(program_only_repository / "m" / "1" / "model.pt2", given)
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], atol=TOLERANCE)
    np.testing.assert_allclose(result.as_numpy("energy")[:, 0], expected["energy"], atol=TOLERANCE)


def test_an_id_beyond_the_embedding_table_is_invalid_argument_and_the_server_serves_on(
    torch_server: ServerProcess,
) -> None:
    bad = inputs(4)
    bad["offset"][2] = 50
    answers = stream_predict(
        torch_server.grpc_target(), [request("m", batch_of(bad), 1), request("m", batch_of(inputs(4)), 2)]
    )
    assert answers[1].code == grpc.StatusCode.INVALID_ARGUMENT, answers[1]
    assert "model 'm'" in answers[1].message and "index" in answers[1].message
    assert answers[2].code == grpc.StatusCode.OK


def test_one_server_serves_the_torch_example_next_to_its_keras_twin_with_the_same_answers(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repository = tmp_path_factory.mktemp("twins")
    shutil.copytree(example_repository / "tabular_mlp", repository / "tabular_mlp")
    generate_torch_examples(repository)
    features = np.random.default_rng(5).standard_normal((700, 64)).astype(np.float32)
    with running_server(repository, socket_dir, tmp_path_factory, "twins") as process:
        answers = stream_predict(
            process.grpc_target(),
            [
                request("tabular_mlp", batch_of({"features": features}), 1),
                request(TORCH_EXAMPLE, batch_of({"features": features}), 2),
            ],
        )
    keras_answer, torch_answer = (answers[batch_id].outputs for batch_id in (1, 2))
    assert keras_answer is not None and torch_answer is not None, answers
    np.testing.assert_allclose(
        column_to_numpy(torch_answer.column("probabilities")),
        column_to_numpy(keras_answer.column("probabilities")),
        atol=TOLERANCE,
    )


@pytest.fixture(scope="module")
def bomb_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``m``, the conv net, and ``bomb``: the same program with its first weight replaced by
    1.9 GB of deflated zeros (which torch 2.13 loads, holding them for as long as it serves)."""
    root = tmp_path_factory.mktemp("bomb-repo")
    program = export_conv_net(root / "m" / "1" / "model.pt2")
    (root / "bomb" / "1").mkdir(parents=True)
    with_entry_replaced(
        program, "weights/weight_0", deflated_zeros(BOMB_BYTES), root / "bomb" / "1" / "model.pt2"
    )
    return root


@pytest.fixture(scope="module")
def bomb_server(
    bomb_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        bomb_repository, socket_dir, tmp_path_factory, "torch-bomb", port=0, http_port=0
    ) as process:
        yield process


def peak_resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))


def test_a_zip_bomb_fails_its_load_naming_the_entry_and_the_sizes_and_the_server_is_ready(
    bomb_server: ServerProcess, bomb_repository: Path
) -> None:
    status, info = http_json(bomb_server.http_address or "", "/v1/models/bomb")
    _, readiness = http_json(bomb_server.http_address or "", "/health/ready")

    assert status == 200 and isinstance(info, dict) and isinstance(readiness, dict)
    assert info["state"] == "failed" and info["served_versions"] == []
    bomb_file = bomb_repository / "bomb" / "1" / "model.pt2"
    with zipfile.ZipFile(bomb_file) as archive:
        packed = archive.getinfo("model/data/weights/weight_0").compress_size
    assert (  # named from the repository down: a client reads no path of the server's
        f"bomb/1/model.pt2 holds model/data/weights/weight_0, which its directory says unpacks to "
        f"{BOMB_BYTES:,} bytes from {packed:,}" in info["error"]
    )
    assert str(bomb_repository) not in info["error"]
    assert "(a zip bomb)" in info["error"]
    assert readiness["ready"] is True and readiness["models"] == {"bomb": "failed", "m": "ready"}


def test_beside_a_zip_bomb_the_model_answers_and_the_server_never_held_the_bomb_unpacked(
    bomb_server: ServerProcess, bomb_repository: Path
) -> None:
    given = inputs(32)
    answer = stream_predict(bomb_server.grpc_target(), [request("m", batch_of(given))])[0]

    assert answer.outputs is not None, answer.message
    expected = torch_outputs(bomb_repository / "m" / "1" / "model.pt2", given)
    np.testing.assert_allclose(
        column_to_numpy(answer.outputs.column("probabilities")), expected["probabilities"], atol=TOLERANCE
    )
    peak = peak_resident_bytes(bomb_server.pid)
    logger.info("the server's peak resident memory: %.0f MiB", peak / (1 << 20))
    assert peak < BOMB_BYTES // 2
