"""The ONNX Runtime backend computes what ONNX Runtime's own session computes, reads inputs and
outputs from the graph, and refuses what it cannot serve with a message naming the model file."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras
import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper
from onnx_graphs import (
    SCORED_TABLE_ROWS,
    allocating_graph,
    custom_op_graph,
    identity_graph,
    model_of,
    scored_graph,
    scored_inputs,
    text_graph,
    write_model,
)

from udfserve.runtime import device
from udfserve.runtime.backends.onnxruntime import OnnxRuntimeModel
from udfserve.runtime.backends.onnxruntime import model as onnxruntime_backend
from udfserve.runtime.backends.onnxruntime.session import (
    CUDA_PROVIDER,
    OnnxRuntimeSettings,
    providers,
    session_options,
)
from udfserve.runtime.errors import DeviceOutOfMemory, InvalidInput, ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import load_model, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.examples.generate_models import publish_example_version

TOLERANCE = 1e-5


def source_of(root: Path, name: str) -> ModelSource:
    scan = scan_repository(root, only=[name])
    assert scan.failures == {}
    return scan.sources[0]


def load(root: Path, name: str) -> OnnxRuntimeModel:
    model = load_model(source_of(root, name))
    assert isinstance(model, OnnxRuntimeModel)
    return model


def refusal(root: Path, name: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(source_of(root, name))
    return str(caught.value)


@pytest.fixture
def scored(tmp_path: Path) -> OnnxRuntimeModel:
    write_model(tmp_path, "scored", scored_graph())
    return load(tmp_path, "scored")


# -- the example exported from Keras ---------------------------------------------------------------


@pytest.fixture(scope="session")
def onnx_example_repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository with ``tabular_mlp_onnx`` added by ``models generate --onnx`` (the
    Keras models already there are kept, so tabular_mlp is the very file the ONNX graph is checked
    against)."""
    root = tmp_path_factory.mktemp("onnx_examples") / "repository"
    shutil.copytree(example_repository, root)
    subprocess.run(
        [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(root), "--onnx"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


@pytest.mark.parametrize("rows", [1, 7, 4096])
def test_the_onnx_export_of_tabular_mlp_predicts_what_the_keras_model_does(
    onnx_example_repository: Path, rows: int
) -> None:
    exported = load(onnx_example_repository, "tabular_mlp_onnx")
    original = keras.saving.load_model(onnx_example_repository / "tabular_mlp" / "1" / "model.keras")
    features = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)

    served = exported.predict({"features": features})["probabilities"]

    np.testing.assert_allclose(served, np.asarray(original(features)), atol=TOLERANCE, rtol=0)


def test_the_onnx_export_of_tabular_mlp_has_the_keras_models_specs(onnx_example_repository: Path) -> None:
    exported = load(onnx_example_repository, "tabular_mlp_onnx")
    keras_model = load_model(source_of(onnx_example_repository, "tabular_mlp"))

    assert (exported.inputs, exported.outputs) == (keras_model.inputs, keras_model.outputs)


def test_a_published_version_of_the_onnx_export_is_the_graph_of_that_versions_keras_weights(
    onnx_example_repository: Path, tmp_path: Path
) -> None:
    for name in ("tabular_mlp", "tabular_mlp_onnx"):
        shutil.copytree(onnx_example_repository / name / "1", tmp_path / name / "1")
        shutil.copy(onnx_example_repository / name / "config.yaml", tmp_path / name / "config.yaml")

    written = publish_example_version(tmp_path, 2, only=("tabular_mlp", "tabular_mlp_onnx"))

    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "tabular_mlp/2",
        "tabular_mlp_onnx/2",
    ]
    assert [p.name for p in (tmp_path / "tabular_mlp_onnx" / "2").iterdir()] == ["model.onnx"]
    features = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)

    def graph_answers(version: int) -> np.ndarray:
        session = ort.InferenceSession(str(tmp_path / "tabular_mlp_onnx" / str(version) / "model.onnx"))
        return np.asarray(session.run(["probabilities"], {"features": features})[0])

    served = graph_answers(2)
    original = keras.saving.load_model(tmp_path / "tabular_mlp" / "2" / "model.keras")
    np.testing.assert_allclose(served, np.asarray(original(features)), atol=TOLERANCE, rtol=0)
    version_1 = graph_answers(1)
    assert not np.allclose(served, version_1, atol=1e-3), "version 2 must have other weights"


def test_publishing_a_version_of_an_onnx_model_other_than_tabular_mlps_graph_is_refused(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "multi_io", scored_graph())

    with pytest.raises(ValueError, match="only tabular_mlp's ONNX graph has a version to publish"):
        publish_example_version(tmp_path, 2, only=("multi_io",))
    assert not (tmp_path / "multi_io" / "2").exists()


# -- specs from the graph --------------------------------------------------------------------------


def test_specs_are_read_from_the_graph_without_a_config(scored: OnnxRuntimeModel) -> None:
    assert scored.platform == "onnxruntime_onnx"
    assert scored.inputs == (
        TensorSpec(name="amount", dtype="float32", shape=(3,)),
        TensorSpec(name="code", dtype="int64", shape=()),
    )
    assert scored.outputs == (
        TensorSpec(name="score", dtype="float32", shape=()),
        TensorSpec(name="scaled", dtype="float64", shape=(3,)),
    )


def test_dynamic_dimensions_after_the_batch_are_free(tmp_path: Path) -> None:
    write_model(tmp_path, "free", identity_graph(TensorProto.FLOAT, [None, "tokens", 4]))

    assert load(tmp_path, "free").inputs == (TensorSpec(name="x", dtype="float32", shape=(-1, 4)),)


@pytest.mark.parametrize("rows", [1, 5, 1000])
def test_predictions_equal_onnxruntimes_own_session_run(scored: OnnxRuntimeModel, rows: int) -> None:
    inputs = scored_inputs(rows, seed=rows)
    own = ort.InferenceSession(str(scored.artifact), providers=["CPUExecutionProvider"])
    expected = dict(zip(["score", "scaled"], own.run(["score", "scaled"], inputs), strict=True))

    served = scored.predict(inputs)

    assert sorted(served) == ["scaled", "score"]
    for name in expected:
        assert served[name].dtype == expected[name].dtype
        np.testing.assert_allclose(served[name], expected[name], atol=TOLERANCE, rtol=0)


def test_string_tensors_go_in_and_come_out_as_utf8_bytes(tmp_path: Path) -> None:
    write_model(tmp_path, "text", text_graph())
    texts = np.array([b"plain", "caf\u00e9 \u2615".encode(), b""], dtype=object)

    answer = load(tmp_path, "text").predict({"text": texts})["same"]

    assert answer.dtype == object
    assert list(answer) == list(texts)


def test_concurrent_predictions_from_threads_match_sequential_ones(scored: OnnxRuntimeModel) -> None:
    batches = [scored_inputs(256, seed=seed) for seed in range(16)]
    sequential = [scored.predict(batch)["score"] for batch in batches]

    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda batch: scored.predict(batch)["score"], batches))

    for alone, together in zip(sequential, concurrent, strict=True):
        np.testing.assert_array_equal(alone, together)


# -- config.yaml -----------------------------------------------------------------------------------


def test_a_config_declaring_the_graphs_specs_is_taken_with_its_fixed_dims(tmp_path: Path) -> None:
    config = (
        "inputs: [{name: x, dtype: float64, shape: [2, 4]}]\n"
        "outputs: [{name: y, dtype: float64, shape: [2, 4]}]\n"
    )
    write_model(tmp_path, "declared", identity_graph(TensorProto.FLOAT, ["batch", "n", 4]), config=config)
    model = load(tmp_path, "declared")

    answer = model.predict({"x": np.full((3, 2, 4), 0.5, dtype=np.float64)})["y"]

    assert model.inputs == (TensorSpec(name="x", dtype="float64", shape=(2, 4)),)
    assert answer.dtype == np.float64 and answer.shape == (3, 2, 4)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("inputs: [{name: features, shape: [4]}]\n", "not in the graph: ['features']; not declared: ['x']"),
        ("inputs: [{name: x, shape: [5]}]\n", "per-row shape [5], but the graph's is [4]"),
        ("inputs: [{name: x, dtype: string, shape: [4]}]\n", "strings and numbers do not convert"),
    ],
    ids=["other_name", "other_shape", "string_for_number"],
)
def test_a_config_disagreeing_with_the_graph_is_refused_naming_both(
    tmp_path: Path, config: str, expected: str
) -> None:
    path = write_model(tmp_path, "disagreeing", identity_graph(), config=config)

    message = refusal(tmp_path, "disagreeing")

    assert str(path) in message and expected in message


# -- warm-up ---------------------------------------------------------------------------------------


def test_warm_up_calls_the_graph_at_load_and_can_be_turned_off(tmp_path: Path) -> None:
    """A graph of float inputs that fails on zeros, the warm-up's input, is refused at load (zeros
    fit float inputs: tests/backend/test_warmup_rules.py says when a failure is only a warning);
    with ``warmup: false`` it loads, and answers the values it takes."""
    write_model(tmp_path, "warm", _zero_refusing_graph())
    write_model(tmp_path, "cold", _zero_refusing_graph(), config="warmup: false\n")

    message = refusal(tmp_path, "warm")
    cold = load(tmp_path, "cold")

    assert "warm-up call of 1 row(s) of zeros failed" in message and "model.onnx" in message
    assert "`warmup: false` loads it without the warm-up" in message
    np.testing.assert_array_equal(cold.predict({"x": np.array([5, 6], dtype=np.float32)})["y"], [10, 20])


def _zero_refusing_graph() -> ModelProto:
    """y = [10, 20][x - 5], x float32 cast to int64: 5 or 6 is answered, 0 reads the table at -5,
    out of its range."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["whole"], to=TensorProto.INT64),
            helper.make_node("Sub", ["whole", "five"], ["index"]),
            helper.make_node("Gather", ["table", "index"], ["y"]),
        ],
        "zero_refusing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch"])],
        initializer=[
            numpy_helper.from_array(np.array([10, 20], dtype=np.int64), "table"),
            numpy_helper.from_array(np.array(5, dtype=np.int64), "five"),
        ],
    )
    return model_of(graph)


# -- refusals at load ------------------------------------------------------------------------------


def test_a_truncated_file_is_refused_naming_it(tmp_path: Path) -> None:
    whole = scored_graph().SerializeToString()
    path = write_model(tmp_path, "truncated", whole[: len(whole) // 2])

    message = refusal(tmp_path, "truncated")

    assert str(path) in message and "not a readable ONNX model" in message and "truncated" in message


def test_a_graph_with_an_op_the_runtime_lacks_is_refused_naming_the_op(tmp_path: Path) -> None:
    path = write_model(tmp_path, "custom", custom_op_graph())

    message = refusal(tmp_path, "custom")

    assert str(path) in message and "com.example.custom:Frobnicate" in message
    assert "custom-op libraries are never registered" in message


@pytest.mark.parametrize(
    ("shape", "expected"),
    [([3, 4], "fixed batch dimension 3"), ([], "has no batch dimension")],
    ids=["fixed_batch", "scalar"],
)
def test_an_input_without_a_batch_dimension_is_refused_naming_it(
    tmp_path: Path, shape: list[int], expected: str
) -> None:
    path = write_model(tmp_path, "unbatched", identity_graph(TensorProto.FLOAT, shape, name="pixels"))

    message = refusal(tmp_path, "unbatched")

    assert str(path) in message and "input 'pixels'" in message and expected in message


@pytest.mark.parametrize(
    ("elem_type", "expected"),
    [
        (TensorProto.UINT32, "element type tensor(uint32), which is not served"),
        (TensorProto.COMPLEX64, "complex64"),
    ],
    ids=["uint32", "complex64"],
)
def test_an_unsupported_element_type_is_refused_naming_it(
    tmp_path: Path, elem_type: int, expected: str
) -> None:
    path = write_model(tmp_path, "odd_type", identity_graph(elem_type))

    message = refusal(tmp_path, "odd_type")

    assert str(path) in message and expected in message


def test_external_data_outside_the_models_folder_is_refused(tmp_path: Path) -> None:
    """ONNX Runtime's own check: a graph whose weights name a file outside its folder never loads."""
    (tmp_path / "outside.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    weights = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../outside.bin"), ("length", "16")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "escaping",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[weights],
    )
    path = write_model(tmp_path, "escaping", model_of(graph))

    message = refusal(tmp_path, "escaping")

    assert str(path) in message and "External data path escapes model directory" in message


def test_an_opset_newer_than_the_runtime_is_refused_naming_it(tmp_path: Path) -> None:
    model = identity_graph()
    model.opset_import[0].version = 99
    path = write_model(tmp_path, "future", model)

    message = refusal(tmp_path, "future")

    assert str(path) in message and "needs an opset" in message and "Opset 99" in message


def test_a_version_folder_without_model_onnx_is_refused_naming_what_it_holds(tmp_path: Path) -> None:
    write_model(tmp_path, "renamed", identity_graph())
    (tmp_path / "renamed" / "1" / "model.onnx").rename(tmp_path / "renamed" / "1" / "graph.onnx")
    (tmp_path / "renamed" / "config.yaml").write_text("backend: onnxruntime\n", encoding="utf-8")

    message = refusal(tmp_path, "renamed")

    assert "no model.onnx in" in message and "graph.onnx" in message


# -- errors of a call ------------------------------------------------------------------------------


def test_an_index_out_of_range_is_invalid_input_naming_the_model(scored: OnnxRuntimeModel) -> None:
    inputs = scored_inputs(4)
    inputs["code"][2] = SCORED_TABLE_ROWS + 89

    with pytest.raises(InvalidInput, match=r"model 'scored'.*idx=99 must be within the inclusive range"):
        scored.predict(inputs)


def test_a_row_shape_the_graph_refuses_is_invalid_input_naming_the_model(scored: OnnxRuntimeModel) -> None:
    inputs = scored_inputs(4) | {"amount": np.zeros((4, 5), dtype=np.float32)}

    with pytest.raises(InvalidInput, match=r"model 'scored'.*invalid dimensions for input: amount"):
        scored.predict(inputs)


def test_text_that_is_not_utf8_is_invalid_input_naming_the_element(tmp_path: Path) -> None:
    write_model(tmp_path, "text", text_graph())

    with pytest.raises(InvalidInput, match=r"input 'text' element 1 is not UTF-8"):
        load(tmp_path, "text").predict({"text": np.array([b"ok", b"\xff\xfe"], dtype=object)})


def test_an_allocation_that_fails_is_device_out_of_memory(tmp_path: Path) -> None:
    write_model(tmp_path, "allocating", allocating_graph())
    model = load(tmp_path, "allocating")

    with pytest.raises(DeviceOutOfMemory, match=r"model 'allocating': out of memory running 2 rows"):
        model.predict({"n": np.array([1, 10**13], dtype=np.int64)})
    np.testing.assert_array_equal(model.predict({"n": np.array([2, 3], dtype=np.int64)})["y"], [2.0, 3.0])


# -- sessions and devices --------------------------------------------------------------------------


def test_sessions_leave_a_core_and_never_spin() -> None:
    options = session_options(OnnxRuntimeSettings())

    assert options.intra_op_num_threads == max(1, len(os.sched_getaffinity(0)) - 1)
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_the_intra_op_threads_setting_wins() -> None:
    assert session_options(OnnxRuntimeSettings(intra_op_threads=3)).intra_op_num_threads == 3


def test_an_invalid_setting_fails_the_load_naming_the_variable_and_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnxruntime_backend, "_settings", None)  # read again, from this environment
    monkeypatch.setenv("UDFSERVE_ONNXRUNTIME_GPU_MEM_LIMIT_BYTES", "lots")
    write_model(tmp_path, "scored", scored_graph())

    message = refusal(tmp_path, "scored")

    assert "model 'scored' version 1" in message
    assert "UDFSERVE_ONNXRUNTIME_GPU_MEM_LIMIT_BYTES='lots'" in message and "valid integer" in message


def test_a_process_not_pinned_to_a_gpu_computes_on_the_cpu_provider(scored: OnnxRuntimeModel) -> None:
    assert scored.providers == ("CPUExecutionProvider",)


def test_a_gpu_pinned_process_asks_for_cuda_device_0_with_the_memory_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(device, "_pinned_device", "gpu:3")
    settings = OnnxRuntimeSettings(gpu_mem_limit_bytes=2 << 30)

    chosen = providers(settings, [CUDA_PROVIDER, "CPUExecutionProvider"])

    assert chosen == [
        (
            CUDA_PROVIDER,
            {"device_id": "0", "arena_extend_strategy": "kSameAsRequested", "gpu_mem_limit": str(2 << 30)},
        ),
        "CPUExecutionProvider",
    ]


def test_a_gpu_pinned_process_without_cuda_computes_on_the_cpu_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """This onnxruntime is the CPU build: it has no CUDA execution provider, as on a GPU node
    where the onnxruntime-gpu package is missing."""
    assert CUDA_PROVIDER not in ort.get_available_providers()
    monkeypatch.setattr(device, "_pinned_device", "gpu:0")
    write_model(tmp_path, "scored", scored_graph())

    with caplog.at_level(logging.WARNING, logger="udfserve.runtime.backends.onnxruntime.session"):
        model = load(tmp_path, "scored")

    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert model.providers == ("CPUExecutionProvider",)
    assert len(warnings) == 1
    assert "runs on the CPU although this process is pinned to gpu:0" in warnings[0]
    assert "no CUDA execution provider" in warnings[0] and "onnxruntime-gpu" in warnings[0]
