"""The backend a version folder's files call for, read from their names without a framework."""

from __future__ import annotations

from pathlib import Path

import pytest

from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_formats import detect_backend
from udfserve.runtime.repository import load_model, scan_repository


def version_folder(root: Path, *files: str, config: str | None = None) -> Path:
    folder = root / "m" / "1"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"")
    if config is not None:
        (root / "m" / "config.yaml").write_text(config)
    return folder


@pytest.mark.parametrize(
    ("file_name", "backend"),
    [
        ("model.keras", "tensorflow"),
        ("saved_model.pb", "tensorflow"),
        ("model.onnx", "onnxruntime"),
        ("model.pt2", "pytorch"),
        ("model.pt", "pytorch"),
        ("model.ubj", "xgboost"),
        ("model.json", "xgboost"),
    ],
)
def test_a_model_file_alone_names_its_backend(tmp_path: Path, file_name: str, backend: str) -> None:
    assert detect_backend(version_folder(tmp_path, file_name)) == backend


def test_a_repository_of_one_onnx_file_and_no_config_is_served_by_onnxruntime(tmp_path: Path) -> None:
    version_folder(tmp_path, "model.onnx")

    (model,) = scan_repository(tmp_path).models

    assert model.default.backend == "onnxruntime"


def test_the_backend_config_yaml_names_wins_over_the_file_names(tmp_path: Path) -> None:
    version_folder(tmp_path, "model.onnx", "model.pt", config="backend: pytorch\n")

    (model,) = scan_repository(tmp_path).models

    assert model.default.backend == "pytorch"


def test_files_of_two_backends_in_one_folder_fail_the_load_naming_both(tmp_path: Path) -> None:
    version_folder(tmp_path, "model.onnx", "model.keras")
    (model,) = scan_repository(tmp_path).models

    with pytest.raises(
        ModelLoadError, match=r"several backends \(tensorflow: model.keras; onnxruntime: model.onnx\)"
    ):
        load_model(model.default)


def test_a_version_folder_without_a_model_file_fails_its_load_listing_what_it_holds(tmp_path: Path) -> None:
    version_folder(tmp_path, "weights.bin")
    (model,) = scan_repository(tmp_path).models

    with pytest.raises(
        ModelLoadError, match=r"no model file in .*expected model.keras .*found \['weights.bin'\]"
    ):
        load_model(model.default)


def test_a_backend_config_yaml_does_not_know_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    version_folder(tmp_path, "model.onnx", config="backend: tensorrt\n")

    scan = scan_repository(tmp_path)

    assert "backend" in scan.failures["m"] and "'onnxruntime'" in scan.failures["m"]
