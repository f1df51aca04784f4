"""The model repository scan: which models and versions are served, and why others are not.

Scanning is pure file-system work; nothing here imports TensorFlow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from udfserve.runtime.backends import get_backend
from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import model_source, no_servable_model, resolve_model_dir, scan_repository


def make_model(root: Path, name: str, versions: tuple[str, ...] = ("1",), config: str | None = None) -> Path:
    model_dir = root / name
    model_dir.mkdir(parents=True)
    for version in versions:
        (model_dir / version).mkdir()
    if config is not None:
        (model_dir / "config.yaml").write_text(config, encoding="utf-8")
    return model_dir


def only_source(root: Path) -> ModelSource:
    scan = scan_repository(root)
    assert scan.failures == {}
    (source,) = scan.sources
    return source


def test_newest_version_is_served_when_none_is_pinned(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "3", "2", "10"))

    source = only_source(tmp_path)

    assert source.version == 10
    assert source.path == tmp_path / "m" / "10"
    assert source.available_versions == (1, 2, 3, 10)


def test_pinned_version_is_served(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "2"), config="version: 1\n")

    assert only_source(tmp_path).version == 1


def test_pinned_version_that_is_absent_is_a_failure_naming_the_config(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "2"), config="version: 5\n")

    scan = scan_repository(tmp_path)

    assert scan.sources == ()
    assert str(tmp_path / "m" / "config.yaml") in scan.failures["m"]
    assert "(version: 5) serves none of the versions [1, 2]" in scan.failures["m"]
    assert "[1, 2]" in scan.failures["m"]


def test_folders_that_are_not_positive_integers_are_not_versions(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("2", "latest", "3.bak", "0", "007"))

    source = only_source(tmp_path)

    assert source.available_versions == (2,)


def test_missing_config_file_means_defaults(tmp_path: Path) -> None:
    make_model(tmp_path, "m")

    assert only_source(tmp_path).config == ModelConfig()


def test_empty_config_file_means_defaults(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="")

    assert only_source(tmp_path).config == ModelConfig()


def test_config_fields_are_read(tmp_path: Path) -> None:
    make_model(
        tmp_path,
        "m",
        config=(
            "name: m\nmax_batch_size: 64\ndynamic_batching:\n  max_queue_delay_s: 0.01\n"
            "inputs:\n  - {name: x, dtype: int32, shape: [3, -1]}\n"
        ),
    )

    config = only_source(tmp_path).config

    assert config.max_batch_size == 64
    assert config.dynamic_batching.max_queue_delay_s == 0.01
    assert config.inputs is not None
    assert (config.inputs[0].name, config.inputs[0].dtype, config.inputs[0].shape) == ("x", "int32", (3, -1))


def test_yaml_syntax_error_is_a_failure_naming_the_file(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="max_batch_size: [1, 2\n")

    scan = scan_repository(tmp_path)

    assert scan.sources == ()
    assert str(tmp_path / "m" / "config.yaml") in scan.failures["m"]
    assert "not valid YAML: line 2, column 1" in scan.failures["m"]


def test_schema_error_is_a_failure_naming_the_file_and_the_field(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="dynamic_batching:\n  max_queue_delay_s: -1\n")

    message = scan_repository(tmp_path).failures["m"]

    assert str(tmp_path / "m" / "config.yaml") in message
    assert "dynamic_batching.max_queue_delay_s" in message
    assert "-1" in message


def test_unknown_config_field_is_a_failure_naming_it(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="max_batchsize: 8\n")

    assert "max_batchsize" in scan_repository(tmp_path).failures["m"]


def test_config_that_is_not_a_mapping_is_a_failure(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="- 1\n- 2\n")

    assert "expected a mapping" in scan_repository(tmp_path).failures["m"]


def test_config_name_that_differs_from_the_folder_is_a_failure(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="name: other\n")

    message = scan_repository(tmp_path).failures["m"]

    assert "'other'" in message
    assert "'m'" in message


def test_model_without_version_folder_is_a_failure(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=())

    assert "no version folder" in scan_repository(tmp_path).failures["m"]


def test_folder_with_an_invalid_model_name_is_a_failure_and_not_served(tmp_path: Path) -> None:
    make_model(tmp_path, "good")
    make_model(tmp_path, "has space")

    scan = scan_repository(tmp_path)

    assert [source.name for source in scan.sources] == ["good"]
    assert "invalid model name 'has space'" in scan.failures["has space"]


def test_hidden_folders_and_files_are_not_models(tmp_path: Path) -> None:
    make_model(tmp_path, ".cache")
    (tmp_path / "README.md").write_text("models\n", encoding="utf-8")
    make_model(tmp_path, "m")

    scan = scan_repository(tmp_path)

    assert [source.name for source in scan.sources] == ["m"]
    assert scan.failures == {}


def test_symlinked_model_folder_outside_the_repository_is_a_failure(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    outside = make_model(tmp_path, "elsewhere")
    (root / "linked").symlink_to(outside, target_is_directory=True)

    scan = scan_repository(root)

    assert scan.sources == ()
    assert "outside the repository" in scan.failures["linked"]


def test_symlinked_model_folder_inside_the_repository_is_served(tmp_path: Path) -> None:
    make_model(tmp_path, "real")
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)

    scan = scan_repository(tmp_path)

    assert sorted(source.name for source in scan.sources) == ["alias", "real"]


def repository_and_outside(tmp_path: Path) -> tuple[Path, Path]:
    """A repository folder, and a folder beside it (outside it) holding files a symlink may name."""
    root, outside = tmp_path / "repo", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside


def test_a_model_file_symlinked_outside_the_repository_is_a_failure_naming_it_and_its_target(
    tmp_path: Path,
) -> None:
    root, outside = repository_and_outside(tmp_path)
    (outside / "model.keras").write_bytes(b"not read")
    version_dir = make_model(root, "m") / "1"
    (version_dir / "model.keras").symlink_to(outside / "model.keras")

    scan = scan_repository(root)

    assert scan.sources == ()
    message = scan.failures["m"]
    assert f"{version_dir / 'model.keras'} resolves to {outside / 'model.keras'}" in message
    assert f"outside the repository {root}" in message


def test_a_config_yaml_symlinked_outside_the_repository_is_a_failure_and_is_not_read(
    tmp_path: Path,
) -> None:
    root, outside = repository_and_outside(tmp_path)
    (outside / "secret").write_text("max_batch_size: [not, yaml, of, a, config\n", encoding="utf-8")
    model_dir = make_model(root, "m")
    (model_dir / "config.yaml").symlink_to(outside / "secret")

    message = scan_repository(root).failures["m"]

    assert f"{model_dir / 'config.yaml'} resolves to {outside / 'secret'}, outside the repository" in message
    assert "YAML" not in message  # refused before it was parsed: nothing of the file is echoed


def test_a_savedmodel_folder_symlinked_outside_the_repository_is_a_failure(tmp_path: Path) -> None:
    root, outside = repository_and_outside(tmp_path)
    (outside / "variables").mkdir()
    version_dir = make_model(root, "m") / "1"
    (version_dir / "saved_model.pb").write_bytes(b"")
    (version_dir / "variables").symlink_to(outside / "variables", target_is_directory=True)

    message = scan_repository(root).failures["m"]

    assert f"{version_dir / 'variables'} resolves to {outside / 'variables'}, outside" in message


def test_a_file_nested_in_a_savedmodel_folder_symlinked_outside_is_a_failure(tmp_path: Path) -> None:
    root, outside = repository_and_outside(tmp_path)
    (outside / "weights").write_bytes(b"")
    version_dir = make_model(root, "m") / "1"
    (version_dir / "saved_model.pb").write_bytes(b"")
    (version_dir / "variables").mkdir()
    (version_dir / "variables" / "variables.index").symlink_to(outside / "weights")

    message = scan_repository(root).failures["m"]

    assert f"{version_dir / 'variables' / 'variables.index'} resolves to {outside / 'weights'}" in message


def test_a_model_file_symlinked_inside_the_repository_is_served(tmp_path: Path) -> None:
    shared = tmp_path / ".shared"  # hidden: not a model itself
    shared.mkdir()
    (shared / "model.keras").write_bytes(b"")
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "model.keras").symlink_to(shared / "model.keras")

    assert only_source(tmp_path).path == version_dir


def test_a_symlink_loop_in_a_model_is_a_failure_naming_it(tmp_path: Path) -> None:
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "a").symlink_to(version_dir / "b")
    (version_dir / "b").symlink_to(version_dir / "a")

    message = scan_repository(tmp_path).failures["m"]

    assert str(version_dir) in message


def test_a_savedmodel_is_a_failure_naming_the_setting_when_savedmodels_are_not_trusted(
    tmp_path: Path,
) -> None:
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "saved_model.pb").write_bytes(b"")

    message = scan_repository(tmp_path, trust_savedmodels=False).failures["m"]

    assert str(version_dir / "saved_model.pb") in message
    assert "SavedModels are not trusted (--no-trust-savedmodels)" in message
    assert "read and write files" in message


def test_a_savedmodel_is_served_when_savedmodels_are_trusted(tmp_path: Path) -> None:
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "saved_model.pb").write_bytes(b"")

    assert only_source(tmp_path).path == version_dir


def test_a_keras_model_is_served_when_savedmodels_are_not_trusted(tmp_path: Path) -> None:
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "model.keras").write_bytes(b"")

    scan = scan_repository(tmp_path, trust_savedmodels=False)

    assert [source.path for source in scan.sources] == [version_dir]


def test_only_limits_the_scan_to_the_named_models(tmp_path: Path) -> None:
    make_model(tmp_path, "a")
    make_model(tmp_path, "b", config="version: 9\n")

    scan = scan_repository(tmp_path, only=["a"])

    assert [source.name for source in scan.sources] == ["a"]
    assert scan.failures == {}


def test_only_naming_an_absent_model_is_a_failure_listing_what_exists(tmp_path: Path) -> None:
    make_model(tmp_path, "a")

    scan = scan_repository(tmp_path, only=["a", "x"])

    assert [source.name for source in scan.sources] == ["a"]
    assert scan.failures == {"x": f"model 'x' is not in the repository {tmp_path}; found: ['a']"}


def test_missing_repository_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_repository(tmp_path / "absent")


def test_repository_that_is_a_file_raises_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")

    with pytest.raises(NotADirectoryError, match="not a folder"):
        scan_repository(tmp_path / "file")


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "", "-flag"])
def test_resolve_model_dir_refuses_unsafe_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="invalid model name"):
        resolve_model_dir(tmp_path, name)


def test_resolve_model_dir_refuses_a_symlink_leaving_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "linked").symlink_to(tmp_path, target_is_directory=True)

    with pytest.raises(ValueError, match="outside the repository"):
        resolve_model_dir(root, "linked")


def test_resolve_model_dir_returns_the_folder_of_a_safe_name(tmp_path: Path) -> None:
    assert resolve_model_dir(tmp_path, "model-1.v2") == tmp_path / "model-1.v2"


def test_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'onnx'; known backends: tensorflow"):
        get_backend("onnx")


def test_importing_the_repository_does_not_import_tensorflow() -> None:
    code = (
        "import sys, udfserve.runtime.repository, udfserve.runtime.backends; "
        "sys.exit('tensorflow' in sys.modules)"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr


def test_a_folder_with_an_invalid_name_is_still_refused_as_an_invalid_name_by_the_model_table(
    tmp_path: Path,
) -> None:
    """The scan keeps such a folder as a failed entry under its own name; asking for it is still
    INVALID_ARGUMENT (not a retryable "failed to load"), as for any name that is not valid."""
    from udfserve.runtime.errors import InvalidInput
    from udfserve.services.model_server.config import ServerConfig
    from udfserve.services.model_server.core.model_control import ModelControl
    from udfserve.services.model_server.core.model_table import ModelTable
    from udfserve.services.model_server.observability.metrics import ServerMetrics

    make_model(tmp_path, "has space")
    config = ServerConfig(model_repository=tmp_path, socket=tmp_path / "s.sock", port=None)
    table = ModelTable(config, ServerMetrics(config.device))
    ModelControl(table).scan_initial()

    with pytest.raises(InvalidInput, match="invalid model name 'has space'"):
        table.ready("has space")


def test_an_empty_repository_is_explained_with_the_layout_expected(tmp_path: Path) -> None:
    reason = no_servable_model(tmp_path, scan_repository(tmp_path))

    assert reason == (
        f"model repository {tmp_path} holds no servable model: found nothing, it is empty; expected a folder "
        "per model, <repo>/<model>/config.yaml (optional) and <repo>/<model>/<version>/ (an integer, "
        "holding model.keras or a SavedModel (TensorFlow), model.onnx (ONNX Runtime), model.pt2 or "
        "model.pt (PyTorch), model.ubj or model.json (XGBoost))"
    )


def test_a_models_own_folder_is_named_with_its_parent_as_the_repository(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", versions=("1",), config="max_batch_size: 8\n")
    (model_dir / "1" / "model.keras").write_bytes(b"")

    reason = no_servable_model(model_dir, scan_repository(model_dir))

    assert f"found '1' (no version folder in {model_dir / '1'}" in reason
    assert "file(s) config.yaml (a model is a folder)" in reason
    assert reason.endswith(
        f"{model_dir} looks like a model's own folder (it holds config.yaml, version folder 1): its parent "
        f"{tmp_path} is probably the repository (--model-repository {tmp_path})"
    )


def test_a_version_folder_is_named_with_the_repository_two_levels_up(tmp_path: Path) -> None:
    version_dir = make_model(tmp_path, "m") / "1"
    (version_dir / "model.keras").write_bytes(b"")

    reason = no_servable_model(version_dir, scan_repository(version_dir))

    assert reason.endswith(
        f"{version_dir} looks like a version folder of a model (it holds model.keras): the repository is "
        f"probably {tmp_path} (--model-repository {tmp_path})"
    )


def test_models_named_but_absent_are_explained_as_such(tmp_path: Path) -> None:
    make_model(tmp_path, "tabular_mlp")

    reason = no_servable_model(tmp_path, scan_repository(tmp_path, ["tabular_mpl"]), ["tabular_mpl"])

    assert reason.startswith(
        f"model repository {tmp_path} holds no servable model of those --models names (tabular_mpl): found "
        f"'tabular_mpl' (model 'tabular_mpl' is not in the repository {tmp_path}; found: ['tabular_mlp'])"
    )


def test_version_policy_latest_serves_the_highest_versions_and_answers_with_the_highest(
    tmp_path: Path,
) -> None:
    make_model(tmp_path, "m", versions=("1", "2", "3"), config="version_policy: {latest: 2}\n")

    (model,) = scan_repository(tmp_path).models

    assert [source.version for source in model.sources] == [2, 3]
    assert model.default.version == 3


def test_version_policy_specific_serves_the_listed_versions_present(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "2", "3"), config="version_policy: {specific: [1, 3, 9]}\n")

    (model,) = scan_repository(tmp_path).models

    assert [source.version for source in model.sources] == [1, 3]


def test_version_policy_all_serves_every_version(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "2", "3"), config="version_policy: {all: true}\n")

    (model,) = scan_repository(tmp_path).models

    assert [source.version for source in model.sources] == [1, 2, 3]


def test_version_policy_naming_two_rules_is_a_failure_naming_the_config(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="version_policy: {latest: 1, all: true}\n")

    message = scan_repository(tmp_path).failures["m"]

    assert "exactly one of latest, specific or all" in message
    assert str(tmp_path / "m" / "config.yaml") in message


def test_version_and_version_policy_together_are_a_failure(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config="version: 1\nversion_policy: {latest: 1}\n")

    assert "version and version_policy both choose" in scan_repository(tmp_path).failures["m"]


def test_a_version_fingerprint_changes_when_a_file_of_it_changes(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m") / "1" / "model.keras"
    artifact.write_bytes(b"first")
    (before,) = scan_repository(tmp_path).sources
    artifact.write_bytes(b"second, longer")

    (after,) = scan_repository(tmp_path).sources

    assert after.fingerprint != before.fingerprint


def test_model_source_of_a_version_the_policy_does_not_serve_names_the_served_ones(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("1", "2"))

    with pytest.raises(ModelLoadError, match=r"version 1 is not served: its version policy serves \[2\]"):
        model_source(tmp_path, "m", 1)
    assert model_source(tmp_path, "m").version == 2
