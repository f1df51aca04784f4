"""The XGBoost backend computes what XGBoost's own ``inplace_predict`` computes, reads its input and
output from the booster, and refuses what it cannot serve with a message naming the model file."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xgboost
from xgboost.core import XGBoostError

from udfserve.runtime import device
from udfserve.runtime.backends.xgboost import XGBoostModel
from udfserve.runtime.backends.xgboost import model as xgboost_backend
from udfserve.runtime.backends.xgboost.errors import call_error
from udfserve.runtime.backends.xgboost.example import FEATURES, NAME, write_examples
from udfserve.runtime.backends.xgboost.placement import CPU, CUDA, choose
from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import load_model, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec


def source_of(root: Path, name: str) -> ModelSource:
    scan = scan_repository(root, only=[name])
    assert scan.failures == {}
    return scan.sources[0]


def load(root: Path, name: str) -> XGBoostModel:
    model = load_model(source_of(root, name))
    assert isinstance(model, XGBoostModel)
    return model


def refusal(root: Path, name: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(source_of(root, name))
    return str(caught.value)


def booster_of(path: Path) -> xgboost.Booster:
    """The file loaded by XGBoost itself, in this process, as a user would."""
    booster = xgboost.Booster()
    booster.load_model(str(path))
    return booster


def rows_of(count: int, features: int = FEATURES, seed: int = 0) -> np.ndarray:
    """Rows in the example's range, with a few values missing (NaN)."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-0.5, 0.5, size=(count, features)).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = np.nan
    return values


def trained(params: dict[str, object], labels: np.ndarray, features: int = 6) -> xgboost.Booster:
    inputs = np.random.default_rng(1).uniform(-0.5, 0.5, size=(len(labels), features)).astype(np.float32)
    return xgboost.train({"nthread": 1, **params}, xgboost.DMatrix(inputs, label=labels), num_boost_round=4)


def write_booster(
    root: Path, name: str, booster: xgboost.Booster, *, file: str = "model.ubj", config: str = ""
) -> Path:
    folder = root / name / "1"
    folder.mkdir(parents=True)
    booster.save_model(str(folder / file))
    if config:
        (root / name / "config.yaml").write_text(config)
    return folder / file


@pytest.fixture(scope="module")
def example_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("xgboost_example")
    write_examples(root)
    return root


@pytest.fixture(scope="module")
def example(example_root: Path) -> XGBoostModel:
    return load(example_root, NAME)


# -- the example and its answers -------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 7, 4096])
def test_predictions_equal_xgboosts_own_inplace_predict(
    example: XGBoostModel, example_root: Path, rows: int
) -> None:
    features = rows_of(rows, seed=rows)
    expected = booster_of(example_root / NAME / "1" / "model.ubj").inplace_predict(features)

    served = example.predict({"features": features})["probability"]

    assert served.dtype == np.float32 and served.shape == (rows,)
    np.testing.assert_array_equal(served, expected)


def test_nan_is_a_missing_value_not_a_refusal(example: XGBoostModel, example_root: Path) -> None:
    features = np.full((3, FEATURES), np.nan, dtype=np.float32)
    booster = booster_of(example_root / NAME / "1" / "model.ubj")

    served = example.predict({"features": features})["probability"]

    np.testing.assert_array_equal(served, booster.inplace_predict(features, missing=np.nan))


def test_the_example_is_the_same_booster_on_every_write(example_root: Path, tmp_path: Path) -> None:
    write_examples(tmp_path)

    written = (tmp_path / NAME / "1" / "model.ubj").read_bytes()

    assert written == (example_root / NAME / "1" / "model.ubj").read_bytes()


def test_specs_are_read_from_the_booster_without_a_config(example: XGBoostModel) -> None:
    assert example.platform == "xgboost_ubj"
    assert example.objective == "binary:logistic"
    assert example.inputs == (TensorSpec(name="features", dtype="float32", shape=(FEATURES,)),)
    assert example.outputs == (TensorSpec(name="probability", dtype="float32", shape=()),)


def test_an_empty_batch_gets_an_empty_answer_of_the_output_shape(tmp_path: Path) -> None:
    write_booster(
        tmp_path, "classes", trained({"objective": "multi:softprob", "num_class": 3}, np.arange(60) % 3)
    )
    model = load(tmp_path, "classes")

    answer = model.predict({"features": np.zeros((0, 6), dtype=np.float32)})["probabilities"]

    assert answer.shape == (0, 3)


# -- objectives ------------------------------------------------------------------------------------

LABELS = np.arange(60) % 3
OBJECTIVES = [
    ({"objective": "binary:logistic"}, LABELS % 2, "probability", ()),
    ({"objective": "multi:softprob", "num_class": 3}, LABELS, "probabilities", (3,)),
    ({"objective": "multi:softmax", "num_class": 3}, LABELS, "prediction", ()),
    ({"objective": "reg:squarederror"}, LABELS * 0.5, "prediction", ()),
    (
        {"objective": "reg:squarederror", "multi_strategy": "multi_output_tree"},
        np.stack([LABELS, -LABELS], axis=1),
        "prediction",
        (2,),
    ),
]


@pytest.mark.parametrize(
    ("params", "labels", "output", "shape"),
    OBJECTIVES,
    ids=["binary", "softprob", "softmax", "regression", "two-targets"],
)
def test_each_objective_gives_its_output_equal_to_xgboosts_own(
    tmp_path: Path, params: dict[str, object], labels: np.ndarray, output: str, shape: tuple[int, ...]
) -> None:
    path = write_booster(tmp_path, "m", trained(params, labels))
    model = load(tmp_path, "m")
    features = rows_of(50, features=6)

    answer = model.predict({"features": features})

    assert model.outputs == (TensorSpec(name=output, dtype="float32", shape=shape),)
    assert answer[output].shape == (50, *shape)
    np.testing.assert_array_equal(answer[output], booster_of(path).inplace_predict(features))


def test_a_json_booster_is_served_as_its_ubjson_twin(tmp_path: Path) -> None:
    booster = trained({"objective": "binary:logistic"}, LABELS % 2)
    write_booster(tmp_path, "as_json", booster, file="model.json")
    write_booster(tmp_path, "as_ubj", booster)
    features = rows_of(20, features=6)

    from_json = load(tmp_path, "as_json")

    assert from_json.platform == "xgboost_json"
    np.testing.assert_array_equal(
        from_json.predict({"features": features})["probability"],
        load(tmp_path, "as_ubj").predict({"features": features})["probability"],
    )


# -- config.yaml -----------------------------------------------------------------------------------


def test_the_input_takes_the_name_config_yaml_declares(tmp_path: Path) -> None:
    config = "inputs:\n  - {name: transaction, dtype: float32, shape: [6]}\n"
    write_booster(tmp_path, "m", trained({"objective": "binary:logistic"}, LABELS % 2), config=config)

    model = load(tmp_path, "m")

    assert model.inputs == (TensorSpec(name="transaction", dtype="float32", shape=(6,)),)
    assert model.predict({"transaction": rows_of(4, features=6)})["probability"].shape == (4,)


def test_declared_outputs_that_agree_are_taken_and_a_wider_dtype_is_cast(tmp_path: Path) -> None:
    config = "outputs:\n  - {name: probability, dtype: float64, shape: []}\n"
    write_booster(tmp_path, "m", trained({"objective": "binary:logistic"}, LABELS % 2), config=config)

    answer = load(tmp_path, "m").predict({"features": rows_of(4, features=6)})["probability"]

    assert answer.dtype == np.float64


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "outputs:\n  - {name: score, dtype: float32, shape: []}\n",
            r"declares outputs \['score'\], but the booster's outputs are \['probability'\]",
        ),
        (
            "inputs:\n  - {name: features, dtype: float32, shape: [7]}\n",
            r"input 'features' with per-row shape \[7\], but the booster's is \[6\]",
        ),
        (
            "inputs:\n  - {name: a, dtype: float32, shape: [3]}\n  - {name: b, dtype: float32, shape: [3]}\n",
            r"declares inputs \['a', 'b'\]; expected one: a booster takes one matrix",
        ),
        (
            "inputs:\n  - {name: features, dtype: string, shape: [6]}\n",
            r"strings and numbers do not convert",
        ),
    ],
    ids=["output-name", "feature-count", "two-inputs", "string-input"],
)
def test_a_config_that_disagrees_with_the_booster_is_refused_naming_the_file(
    tmp_path: Path, config: str, expected: str
) -> None:
    path = write_booster(tmp_path, "m", trained({"objective": "binary:logistic"}, LABELS % 2), config=config)

    message = refusal(tmp_path, "m")

    assert str(path) in message
    assert re.search(expected, message), message


# -- bad input -------------------------------------------------------------------------------------


def test_a_wrong_feature_count_is_invalid_input_naming_the_count_expected(example: XGBoostModel) -> None:
    with pytest.raises(InvalidInput, match=r"input 'features' has per-row shape \(5,\); expected \(32,\)"):
        example.predict({"features": rows_of(3, features=5)})


def test_a_missing_input_is_invalid_input_naming_what_came(example: XGBoostModel) -> None:
    with pytest.raises(InvalidInput, match=r"missing input 'features'; received \['x'\]"):
        example.predict({"x": rows_of(3)})


def test_xgboosts_refusal_of_the_columns_is_invalid_input(example_root: Path) -> None:
    """What XGBoost itself says of a matrix whose columns disagree with its trees, as a call would."""
    booster = booster_of(example_root / NAME / "1" / "model.ubj")
    with pytest.raises(XGBoostError) as caught:
        booster.inplace_predict(rows_of(2, features=5), validate_features=False)

    error = call_error("tabular_xgb", 2, caught.value)

    assert isinstance(error, InvalidInput)
    assert "the booster refused the request's features" in error.message
    assert "Stack trace" not in error.message and "[bt]" not in error.message


@pytest.mark.parametrize(
    "failure",
    [MemoryError(), XGBoostError("[10:00:00] /src/c_api.cu:12: cudaErrorMemoryAllocation: out of memory")],
    ids=["host", "cuda"],
)
def test_an_allocation_that_fails_is_device_out_of_memory(failure: Exception) -> None:
    assert isinstance(call_error("m", 4096, failure), DeviceOutOfMemory)


def test_any_other_failure_is_a_backend_fault_without_its_source_location() -> None:
    error = call_error(
        "m", 2, XGBoostError("[10:00:00] /workspace/src/gbm.h:109: something broke\nStack trace:\n [bt]")
    )

    assert isinstance(error, BackendFault) and not isinstance(error, DeviceOutOfMemory)
    assert error.message == "model 'm': xgboost failed running 2 rows: XGBoostError: something broke"


# -- wrong files -----------------------------------------------------------------------------------


def test_a_file_that_is_not_a_booster_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.ubj").write_bytes(b"\x00\x01 not a booster")

    message = refusal(tmp_path, "m")

    assert f"cannot load {folder / 'model.ubj'}" in message
    assert "expected a booster saved by Booster.save_model" in message


def test_a_pickled_booster_is_refused_unread(tmp_path: Path) -> None:
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.ubj").write_bytes(pickle.dumps(trained({"objective": "binary:logistic"}, LABELS % 2)))

    assert "expected a booster saved by Booster.save_model" in refusal(tmp_path, "m")


def test_a_truncated_json_booster_is_refused(tmp_path: Path) -> None:
    path = write_booster(
        tmp_path, "m", trained({"objective": "binary:logistic"}, LABELS % 2), file="model.json"
    )
    path.write_text(path.read_text()[:500])

    assert f"cannot load {path}" in refusal(tmp_path, "m")


def test_both_formats_in_one_folder_are_refused_naming_both(tmp_path: Path) -> None:
    booster = trained({"objective": "binary:logistic"}, LABELS % 2)
    path = write_booster(tmp_path, "m", booster)
    booster.save_model(str(path.with_name("model.json")))

    assert "holds model.ubj and model.json; expected one booster file" in refusal(tmp_path, "m")


def test_a_linear_booster_is_refused_as_one_xgboost_cannot_predict_in_place(tmp_path: Path) -> None:
    write_booster(tmp_path, "m", trained({"booster": "gblinear", "objective": "binary:logistic"}, LABELS % 2))

    message = refusal(tmp_path, "m")

    assert "the booster is 'gblinear', which XGBoost cannot predict in place" in message
    assert "expected a tree booster (gbtree or dart)" in message


# -- threads and devices ---------------------------------------------------------------------------


def booster_threads(model: XGBoostModel) -> int:
    config = json.loads(model._booster.save_config())
    return int(config["learner"]["generic_param"]["nthread"])


def test_a_call_takes_one_core_short_of_the_process(example: XGBoostModel) -> None:
    cores = max(1, len(os.sched_getaffinity(0)) - 1)

    assert example.threads == cores and booster_threads(example) == cores


def test_the_threads_setting_wins(example_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xgboost_backend, "_settings", None)  # read again, from this environment
    monkeypatch.setenv("UDFSERVE_XGBOOST_THREADS", "3")

    assert booster_threads(load(example_root, NAME)) == 3


def test_an_invalid_setting_fails_the_load_naming_the_variable_and_the_model(
    example_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xgboost_backend, "_settings", None)
    monkeypatch.setenv("UDFSERVE_XGBOOST_THREADS", "many")

    message = refusal(example_root, NAME)

    assert "model 'tabular_xgb' version 1" in message
    assert "UDFSERVE_XGBOOST_THREADS='many'" in message and "valid integer" in message


def test_a_process_not_pinned_to_a_gpu_computes_on_the_cpu(example: XGBoostModel) -> None:
    assert example.device == CPU


def test_a_gpu_pinned_process_without_cuda_in_xgboost_computes_on_the_cpu_with_one_warning(
    example_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """This xgboost is the xgboost-cpu build, as on a GPU node where the CUDA build is missing."""
    assert not xgboost.build_info()["USE_CUDA"]
    monkeypatch.setattr(device, "_pinned_device", "gpu:1")

    with caplog.at_level(logging.WARNING, logger="udfserve.runtime.backends.xgboost.placement"):
        model = load(example_root, NAME)

    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert model.device == CPU
    assert len(warnings) == 1
    assert (
        "model 'tabular_xgb' version 1 (model.ubj) runs on the CPU although this process is pinned to gpu:1"
        in (warnings[0])
    )
    assert "has no CUDA (the xgboost-cpu build" in warnings[0] and "udfserve[xgboost]" in warnings[0]
    features = rows_of(5)
    np.testing.assert_array_equal(
        model.predict({"features": features})["probability"],
        booster_of(example_root / NAME / "1" / "model.ubj").inplace_predict(features),
    )


@pytest.mark.parametrize(
    ("pinned", "has_cuda", "has_cupy", "chosen", "why"),
    [
        (None, True, True, CPU, ""),
        ("cpu", True, True, CPU, ""),
        ("sim:0", True, True, CPU, ""),
        ("gpu:2", True, True, CUDA, ""),
        ("gpu:2", False, True, CPU, "has no CUDA"),
        ("gpu:2", True, False, CPU, "cupy is not installed"),
    ],
)
def test_the_device_follows_the_pin_the_build_and_cupy(
    pinned: str | None, has_cuda: bool, has_cupy: bool, chosen: str, why: str
) -> None:
    placement = choose(pinned, has_cuda, has_cupy)

    assert placement.device == chosen
    assert (why in placement.why_cpu) if why else placement.why_cpu == ""


# -- the example generator, through the command ----------------------------------------------------


@pytest.mark.slow
def test_models_generate_backend_examples_writes_tabular_xgb_beside_the_examples(
    example_repository: Path, example_root: Path, tmp_path: Path
) -> None:
    """Into a copy of the example repository: the Keras models there are kept, tabular_xgb is added."""
    root = tmp_path / "repository"
    shutil.copytree(example_repository, root)

    subprocess.run(
        [
            sys.executable,
            "-m",
            "udfserve",
            "models",
            "generate",
            "--output",
            str(root),
            "--backend-examples",
            "xgboost",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )

    assert (root / NAME / "1" / "model.ubj").read_bytes() == (
        example_root / NAME / "1" / "model.ubj"
    ).read_bytes()
    assert "max_batch_size: 4096" in (root / NAME / "config.yaml").read_text()
    assert load(root, NAME).outputs == (TensorSpec(name="probability", dtype="float32", shape=()),)
