"""What a model repository can make a server do: every file of a model lies inside the repository,
and SavedModels, whose graphs can read and write files, are refused unless they are trusted.

Each server gets a repository of its own holding ``reads_file`` (``file_reading_model.py``: a
SavedModel that answers with the bytes of a file outside the repository and writes them to a
marker file of its repository's own), the example ``tabular_mlp`` (so the server serves), a
model whose ``model.keras`` is a symlink to a file outside the repository, and one whose
``config.yaml`` is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from file_reading_model import INPUT_NAME, MODEL_NAME, OUTPUT_NAME
from server_harness import Answer, batch_of, request, running_server, stream_predict

from udfserve.services.model_server.launcher import ServerProcess

SECRET = b"only the server's user may read this\n"


@dataclass(frozen=True)
class Repository:
    path: Path
    marker: Path
    """Where ``reads_file`` writes what it read, each time its graph runs."""


@dataclass(frozen=True)
class Repositories:
    secret: Path
    untrusting: Repository
    trusting: Repository


@pytest.fixture(scope="module")
def repositories(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Repositories:
    folder = tmp_path_factory.mktemp("repository-trust")
    secret = folder / "secret.txt"
    secret.write_bytes(SECRET)
    untrusting = Repository(folder / "untrusting", folder / "untrusting.marker")
    trusting = Repository(folder / "trusting", folder / "trusting.marker")
    pairs = [str(path) for repo in (untrusting, trusting) for path in (repo.path, repo.marker)]
    subprocess.run(
        [sys.executable, str(Path(__file__).with_name("file_reading_model.py")), str(secret), *pairs],
        check=True,
        capture_output=True,
        timeout=300,
    )
    for repository in (untrusting, trusting):
        shutil.copytree(example_repository / "tabular_mlp", repository.path / "tabular_mlp")
        keras_file = repository.path / "linked_keras" / "1" / "model.keras"
        keras_file.parent.mkdir(parents=True)
        keras_file.symlink_to(example_repository / "tabular_mlp" / "1" / "model.keras")
        shutil.copytree(example_repository / "tabular_mlp", repository.path / "linked_config")
        (repository.path / "linked_config" / "config.yaml").unlink()
        (repository.path / "linked_config" / "config.yaml").symlink_to(secret)
    return Repositories(secret, untrusting, trusting)


@pytest.fixture(scope="module")
def untrusting_server(
    repositories: Repositories, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        repositories.untrusting.path,
        socket_dir,
        tmp_path_factory,
        "untrusting",
        ["--no-trust-savedmodels"],
        port=None,
        http_port=None,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def trusting_server(
    repositories: Repositories, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        repositories.trusting.path, socket_dir, tmp_path_factory, "trusting", port=None, http_port=None
    ) as process:
        yield process


def predict(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> Answer:
    return stream_predict(server.grpc_target(), [request(model, batch_of(inputs))])[0]


def test_a_savedmodel_is_refused_when_savedmodels_are_not_trusted_and_its_graph_never_runs(
    untrusting_server: ServerProcess, repositories: Repositories
) -> None:
    answer = predict(untrusting_server, MODEL_NAME, {INPUT_NAME: np.zeros((2, 1), np.float32)})

    assert answer.code == grpc.StatusCode.UNAVAILABLE
    # a client reads the file from the repository down; the server's log keeps its absolute path
    assert f"{MODEL_NAME}/1/saved_model.pb: a TensorFlow SavedModel, refused" in answer.message
    assert str(repositories.untrusting.path) not in answer.message
    assert "--no-trust-savedmodels" in answer.message and "--trust-savedmodels" in answer.message
    assert not repositories.untrusting.marker.exists()  # a loaded model is warmed up: it never was


def test_a_trusted_savedmodel_reads_and_writes_files_with_the_servers_permissions(
    trusting_server: ServerProcess, repositories: Repositories
) -> None:
    """For the record: what ``--no-trust-savedmodels`` keeps out. Serving SavedModels is the default."""
    answer = predict(trusting_server, MODEL_NAME, {INPUT_NAME: np.zeros((2, 1), np.float32)})

    assert answer.outputs is not None
    assert answer.outputs.column(OUTPUT_NAME).to_pylist() == [SECRET, SECRET]
    assert repositories.trusting.marker.read_bytes() == SECRET


def test_a_model_file_symlinked_outside_the_repository_is_refused_naming_the_link_not_the_servers_paths(
    untrusting_server: ServerProcess, repositories: Repositories, example_repository: Path
) -> None:
    answer = predict(untrusting_server, "linked_keras", {"features": np.ones((2, 64), np.float32)})

    assert answer.code == grpc.StatusCode.UNAVAILABLE
    target = (example_repository / "tabular_mlp" / "1" / "model.keras").resolve()
    assert "linked_keras/1/model.keras resolves to model.keras, outside the repository" in answer.message
    assert str(target) not in answer.message and str(repositories.untrusting.path) not in answer.message


def test_a_config_yaml_symlinked_outside_the_repository_is_refused_unread(
    untrusting_server: ServerProcess, repositories: Repositories
) -> None:
    answer = predict(untrusting_server, "linked_config", {"features": np.ones((2, 64), np.float32)})

    assert answer.code == grpc.StatusCode.UNAVAILABLE
    secret_name = repositories.secret.resolve().name
    assert f"linked_config/config.yaml resolves to {secret_name}, outside the repository" in answer.message
    assert str(repositories.secret.resolve()) not in answer.message
    assert SECRET.decode().strip() not in answer.message


def test_a_keras_model_is_served_when_savedmodels_are_not_trusted(untrusting_server: ServerProcess) -> None:
    answer = predict(untrusting_server, "tabular_mlp", {"features": np.ones((2, 64), np.float32)})

    assert answer.code == grpc.StatusCode.OK
