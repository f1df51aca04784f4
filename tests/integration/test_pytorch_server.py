"""A real server of a repository holding nothing but ``m/1/model.pt2`` (a model no example uses,
no config.yaml) answers over the Arrow protocol and KServe with torch's own numbers, and tells
a client's bad input as INVALID_ARGUMENT; one server serves a PyTorch model beside a Keras one."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from server_harness import batch_of, column_to_numpy, request, running_server, stream_predict
from torch_programs import CLASSES, IMAGE_SHAPE, conv_net_repository, torch_outputs

from udfserve.services.examples.torch_models import TORCH_EXAMPLE, generate_torch_examples
from udfserve.services.model_server.launcher import ServerProcess

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5


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
