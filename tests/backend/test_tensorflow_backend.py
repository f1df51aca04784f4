"""The TensorFlow backend computes what Keras computes, for every example model and batch size,
reads inputs and outputs from the model's signature, and refuses what it cannot serve with a
message naming the model and the file."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from udfserve.runtime.backends import LoadedModel
from udfserve.runtime.backends.tensorflow import TensorFlowModel
from udfserve.runtime.backends.tensorflow.calls import VerifiedCall, to_numpy, to_tensor
from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import load_model, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec

KERAS_MODELS = ("tabular_mlp", "sequence_bilstm", "multi_io", "text_hashing")
TOLERANCE = 1e-5


@pytest.fixture(scope="session")
def sources(example_repository: Path) -> dict[str, ModelSource]:
    scan = scan_repository(example_repository)
    assert scan.failures == {}
    return {source.name: source for source in scan.sources}


@pytest.fixture(scope="session")
def loaded(sources: dict[str, ModelSource]) -> dict[str, LoadedModel]:
    return {name: load_model(source) for name, source in sources.items()}


def random_inputs(specs: tuple[TensorSpec, ...], rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in specs:
        shape = (rows, *spec.shape)
        if spec.dtype == "string":
            words = [f"word {index}".encode() for index in rng.integers(0, 50, size=math.prod(shape))]
            arrays[spec.name] = np.array(words, dtype=object).reshape(shape)
        elif spec.dtype.startswith("int"):
            arrays[spec.name] = rng.integers(0, 16, size=shape).astype(spec.dtype)
        else:
            arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return arrays


def keras_reference(source: ModelSource, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What Keras itself computes, calling the .keras file's model in-process."""
    model = keras.saving.load_model(source.path / "model.keras", compile=False)
    result = model(inputs if len(inputs) > 1 else next(iter(inputs.values())))
    if isinstance(result, dict):
        return {name: np.asarray(value) for name, value in result.items()}
    return {model.output_names[0]: np.asarray(result)}


def copy_model(source: ModelSource, root: Path, config: str) -> ModelSource:
    """A one-version copy of ``source`` under ``root`` with its own config.yaml."""
    model_dir = root / source.name
    shutil.copytree(source.path, model_dir / "1")
    (model_dir / "config.yaml").write_text(config, encoding="utf-8")
    scan = scan_repository(root, only=[source.name])
    assert scan.failures == {}
    return scan.sources[0]


@pytest.mark.parametrize("name", KERAS_MODELS)
@pytest.mark.parametrize("batch", ["one", "seven", "max_batch_size", "three_times_max"])
def test_predictions_equal_keras_for_every_batch_size(
    name: str, batch: str, sources: dict[str, ModelSource], loaded: dict[str, LoadedModel]
) -> None:
    max_rows = sources[name].config.max_batch_size
    rows = {"one": 1, "seven": 7, "max_batch_size": max_rows, "three_times_max": 3 * max_rows}[batch]
    model = loaded[name]
    inputs = random_inputs(model.inputs, rows)

    predicted = model.predict(inputs)
    expected = keras_reference(sources[name], inputs)

    assert sorted(predicted) == sorted(expected)
    for output, values in predicted.items():
        assert values.shape == expected[output].shape
        np.testing.assert_allclose(values, expected[output], atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"),
    [
        (
            "tabular_mlp",
            [("features", "float32", (64,))],
            [("probabilities", "float32", (8,))],
        ),
        (
            "sequence_bilstm",
            [("lines", "float32", (16, 32))],
            [("class_probabilities", "float32", (4,))],
        ),
        (
            "multi_io",
            [("category", "int32", ()), ("numeric", "float32", (8,))],
            [("embedding", "float32", (4,)), ("score", "float32", ())],
        ),
        (
            "tabular_mlp_savedmodel",
            [("features", "float32", (64,))],
            [("probabilities", "float32", (8,))],
        ),
        (
            "text_hashing",
            [("text", "string", ())],
            [("probabilities", "float32", (3,))],
        ),
    ],
)
def test_specs_are_read_from_the_model_signature(
    name: str,
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]],
    loaded: dict[str, LoadedModel],
) -> None:
    model = loaded[name]

    assert sorted((s.name, s.dtype, s.shape) for s in model.inputs) == inputs
    assert sorted((s.name, s.dtype, s.shape) for s in model.outputs) == outputs
    assert (model.name, model.version, model.platform) == (name, 1, "tensorflow")


@pytest.mark.parametrize("name", [*KERAS_MODELS, "tabular_mlp_savedmodel"])
def test_outputs_have_the_declared_dtype_and_one_row_per_input_row(
    name: str, loaded: dict[str, LoadedModel]
) -> None:
    model = loaded[name]

    predicted = model.predict(random_inputs(model.inputs, 5))

    assert [(spec.name, spec.dtype, (5, *spec.shape)) for spec in model.outputs] == [
        (output, str(values.dtype), values.shape) for output, values in predicted.items()
    ]


def test_savedmodel_agrees_with_the_keras_model(loaded: dict[str, LoadedModel]) -> None:
    inputs = random_inputs(loaded["tabular_mlp"].inputs, 33)

    from_savedmodel = loaded["tabular_mlp_savedmodel"].predict(inputs)
    from_keras = loaded["tabular_mlp"].predict(inputs)

    np.testing.assert_allclose(
        from_savedmodel["probabilities"], from_keras["probabilities"], atol=TOLERANCE, rtol=TOLERANCE
    )


def test_concurrent_predictions_from_threads_match_sequential_ones(loaded: dict[str, LoadedModel]) -> None:
    model = loaded["multi_io"]
    batches = [random_inputs(model.inputs, rows, seed=rows) for rows in range(1, 17)]
    sequential = [model.predict(batch) for batch in batches]

    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(model.predict, batches))

    for alone, together in zip(sequential, concurrent, strict=True):
        for output in alone:
            np.testing.assert_array_equal(alone[output], together[output])


@pytest.mark.parametrize("name", [*KERAS_MODELS, "tabular_mlp_savedmodel"])
def test_every_example_model_is_served_through_the_graphs_flat_call(
    name: str, loaded: dict[str, LoadedModel]
) -> None:
    """The flat call (no argument binding in Python) agreed with the public one on the first call
    and serves from then on; a model with several outputs proves the output order is right."""
    model = loaded[name]
    assert isinstance(model, TensorFlowModel)

    model.predict(random_inputs(model.inputs, 3))

    assert model._call.uses_fast_call is True


def _doubled(tensors: list[tf.Tensor]) -> dict[str, tf.Tensor]:
    return {"y": tensors[0] * 2.0}


def test_a_fast_call_that_disagrees_is_never_used_and_its_answer_never_returned() -> None:
    calls: list[str] = []

    def wrong(tensors: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        calls.append("fast")
        return {"y": tensors[0] * 3.0}

    call = VerifiedCall(wrong, _doubled)
    x = [tf.constant([[1.0, 2.0]])]

    first, second = call(x), call(x)

    assert call.uses_fast_call is False
    np.testing.assert_array_equal(first["y"].numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(second["y"].numpy(), [[2.0, 4.0]])
    assert calls == ["fast"]  # tried once, to decide


def test_a_fast_call_that_fails_leaves_the_public_call_serving() -> None:
    def broken(tensors: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        raise TypeError("call_flat() takes 2 positional arguments")

    call = VerifiedCall(broken, _doubled)

    answer = call([tf.constant([1.0])])

    assert call.uses_fast_call is False
    np.testing.assert_array_equal(answer["y"].numpy(), [2.0])


def test_nan_answers_equal_on_both_calls_let_the_fast_call_serve() -> None:
    def log(tensors: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"y": tf.math.log(tensors[0]) * 0.0}  # log(0) * 0 is NaN

    call = VerifiedCall(log, log)

    call([tf.constant([0.0, 1.0])])

    assert call.uses_fast_call is True


def test_a_fast_call_with_other_output_names_is_not_trusted() -> None:
    call = VerifiedCall(lambda tensors: {"z": tensors[0] * 2.0}, _doubled)

    call([tf.constant([1.0])])

    assert call.uses_fast_call is False


def test_the_fast_call_serves_once_it_agreed() -> None:
    calls: list[str] = []

    def fast(tensors: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        calls.append("fast")
        return _doubled(tensors)

    call = VerifiedCall(fast, _doubled)
    assert call.uses_fast_call is None

    call([tf.constant([1.0])])
    answer = call([tf.constant([5.0])])

    assert call.uses_fast_call is True
    assert calls == ["fast", "fast"]
    np.testing.assert_array_equal(answer["y"].numpy(), [10.0])


def test_missing_input_is_invalid_input_naming_it(loaded: dict[str, LoadedModel]) -> None:
    model = loaded["multi_io"]
    inputs = random_inputs(model.inputs, 2)
    del inputs["category"]

    with pytest.raises(InvalidInput, match=r"missing input\(s\) \['category'\]"):
        model.predict(inputs)


def test_an_input_feeding_an_embedding_takes_the_table_s_ids_as_its_range(
    loaded: dict[str, LoadedModel],
) -> None:
    specs = {spec.name: spec for spec in loaded["multi_io"].inputs}
    assert specs["category"].range == (0, 15)
    assert specs["numeric"].range is None
    assert all(spec.range is None for spec in loaded["text_hashing"].inputs)  # hashed before its table


def test_a_range_declared_in_config_wins_over_the_model_s(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(
        sources["multi_io"],
        tmp_path,
        "inputs:\n"
        "  - {name: numeric, dtype: float32, shape: [8]}\n"
        "  - {name: category, dtype: int32, range: [0, 7]}\n",
    )
    specs = {spec.name: spec for spec in load_model(source).inputs}
    assert specs["category"].range == (0, 7)


def savedmodel_of_multi_io(sources: dict[str, ModelSource], root: Path) -> LoadedModel:
    """multi_io as a SavedModel: no Keras layers to read a range from, so its graph meets every id."""
    model = keras.saving.load_model(sources["multi_io"].path / "model.keras", compile=False)
    version_dir = root / "multi_io_savedmodel" / "1"
    model.export(str(version_dir), format="tf_saved_model", verbose=False)
    scan = scan_repository(root, only=["multi_io_savedmodel"])
    assert scan.failures == {}
    return load_model(scan.sources[0])


@pytest.mark.parametrize("category", [99, np.iinfo(np.int32).max, np.iinfo(np.int32).min])
def test_ids_the_graph_refuses_are_invalid_input_in_one_line_without_tensorflow_s_trace(
    sources: dict[str, ModelSource], tmp_path: Path, category: int
) -> None:
    model = savedmodel_of_multi_io(sources, tmp_path)
    assert all(spec.range is None for spec in model.inputs)
    inputs = {"numeric": np.zeros((2, 8), np.float32), "category": np.array([1, category], np.int32)}

    with pytest.raises(InvalidInput) as refused:
        model.predict(inputs)

    message = refused.value.message
    # Keras's take wraps a negative id once (INT32_MIN comes back as INT32_MIN + 16)
    assert (
        re.search(r"indices\[1\] = -?\d+ is not in \[0, 16\)", message) and "'multi_io_savedmodel'" in message
    )
    assert "\n" not in message and "File " not in message and ".py" not in message and "{{" not in message


def test_config_that_agrees_with_the_model_is_used(sources: dict[str, ModelSource], tmp_path: Path) -> None:
    source = copy_model(
        sources["multi_io"],
        tmp_path,
        "inputs:\n  - {name: numeric, shape: [8]}\n  - {name: category, dtype: int32}\n"
        "outputs:\n  - {name: embedding, shape: [4]}\n  - {name: score}\n",
    )

    model = load_model(source)

    assert [spec.name for spec in model.inputs] == ["numeric", "category"]
    assert [spec.name for spec in model.outputs] == ["embedding", "score"]


def test_declared_dtypes_are_cast_to_and_from_the_model(
    sources: dict[str, ModelSource], loaded: dict[str, LoadedModel], tmp_path: Path
) -> None:
    source = copy_model(
        sources["tabular_mlp"],
        tmp_path,
        "inputs:\n  - {name: features, dtype: float64, shape: [64]}\n"
        "outputs:\n  - {name: probabilities, dtype: float64, shape: [8]}\n",
    )
    model = load_model(source)
    inputs = random_inputs(loaded["tabular_mlp"].inputs, 4)

    predicted = model.predict({"features": inputs["features"].astype("float64")})

    assert predicted["probabilities"].dtype == np.float64
    np.testing.assert_allclose(
        predicted["probabilities"], loaded["tabular_mlp"].predict(inputs)["probabilities"], atol=TOLERANCE
    )


def test_a_savedmodel_with_a_string_signature_answers_like_its_keras_model(
    sources: dict[str, ModelSource], loaded: dict[str, LoadedModel], tmp_path: Path
) -> None:
    keras_model = keras.saving.load_model(sources["text_hashing"].path / "model.keras", compile=False)
    keras_model.export(str(tmp_path / "text_hashing" / "1"), format="tf_saved_model", verbose=False)
    (tmp_path / "text_hashing" / "config.yaml").write_text("max_batch_size: 8\n", encoding="utf-8")
    model = load_model(scan_repository(tmp_path).sources[0])
    inputs = random_inputs(loaded["text_hashing"].inputs, 5)

    assert [(spec.name, spec.dtype) for spec in model.inputs] == [("text", "string")]
    exported = next(iter(model.predict(inputs).values()))
    np.testing.assert_allclose(exported, keras_reference(sources["text_hashing"], inputs)["probabilities"])


def test_text_and_bytes_of_the_same_strings_give_the_same_predictions(loaded: dict[str, LoadedModel]) -> None:
    model = loaded["text_hashing"]
    texts = ["héllo", "", "spark"]

    as_bytes = model.predict({"text": np.array([t.encode() for t in texts], dtype=object)})
    as_text = model.predict({"text": np.array(texts, dtype=object)})

    np.testing.assert_array_equal(as_bytes["probabilities"], as_text["probabilities"])


def test_config_declaring_a_number_for_a_string_input_is_refused_naming_both_dtypes(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(sources["text_hashing"], tmp_path, "inputs:\n  - {name: text, dtype: float32}\n")

    with pytest.raises(ModelLoadError, match=r"input 'text' as float32, but the model's is string"):
        load_model(source)


def test_config_declaring_a_string_for_a_numeric_input_is_refused_naming_both_dtypes(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(
        sources["tabular_mlp"], tmp_path, "inputs:\n  - {name: features, dtype: string, shape: [64]}\n"
    )

    with pytest.raises(ModelLoadError, match=r"input 'features' as string, but the model's is float32"):
        load_model(source)


def test_config_declaring_a_wrong_input_name_is_refused_naming_it(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(sources["tabular_mlp"], tmp_path, "inputs:\n  - {name: pixels, shape: [64]}\n")

    with pytest.raises(ModelLoadError, match=r"not in the model: \['pixels'\]") as raised:
        load_model(source)
    assert "'tabular_mlp'" in str(raised.value)
    assert str(source.path / "model.keras") in str(raised.value)


def test_config_declaring_a_wrong_shape_is_refused_naming_both_shapes(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(sources["sequence_bilstm"], tmp_path, "inputs:\n  - {name: lines, shape: [16, 31]}\n")

    with pytest.raises(
        ModelLoadError, match=r"'lines' with per-row shape \[16, 31\].*the model.s is \[16, 32\]"
    ):
        load_model(source)


def test_config_declaring_a_wrong_output_name_is_refused_naming_it(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(sources["multi_io"], tmp_path, "outputs:\n  - {name: score}\n  - {name: vector}\n")

    with pytest.raises(
        ModelLoadError, match=r"not in the model: \['vector'\]; not declared: \['embedding'\]"
    ):
        load_model(source)


def test_corrupt_keras_file_is_refused_naming_the_model_and_the_file(
    sources: dict[str, ModelSource], tmp_path: Path
) -> None:
    source = copy_model(sources["tabular_mlp"], tmp_path, "")
    (source.path / "model.keras").write_bytes(b"this is not a zip archive")

    with pytest.raises(ModelLoadError) as raised:
        load_model(source)
    assert "model 'tabular_mlp' version 1" in str(raised.value)
    assert str(source.path / "model.keras") in str(raised.value)


def test_legacy_hdf5_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "old" / "1").mkdir(parents=True)
    (tmp_path / "old" / "1" / "model.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    (source,) = scan_repository(tmp_path).sources

    with pytest.raises(ModelLoadError, match=r"model\.h5 is a legacy HDF5 model, which is not served"):
        load_model(source)


def test_version_folder_without_a_model_is_refused_listing_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "empty" / "1").mkdir(parents=True)
    (tmp_path / "empty" / "1" / "notes.txt").write_text("", encoding="utf-8")
    (source,) = scan_repository(tmp_path).sources

    with pytest.raises(
        ModelLoadError,
        match=r"no model file in .*: expected model\.keras or a SavedModel .*; found \['notes\.txt'\]",
    ):
        load_model(source)


def test_model_with_a_lambda_layer_is_refused_by_safe_mode(tmp_path: Path) -> None:
    features = keras.Input(shape=(2,), name="features")
    doubled = keras.layers.Lambda(lambda x: x * 2, name="doubled")(features)
    (tmp_path / "lambda_model" / "1").mkdir(parents=True)
    keras.Model(features, doubled).save(tmp_path / "lambda_model" / "1" / "model.keras")
    (source,) = scan_repository(tmp_path).sources

    with pytest.raises(ModelLoadError, match="safe_mode") as raised:
        load_model(source)
    assert "model 'lambda_model' version 1" in str(raised.value)


def aligned_copy(array: np.ndarray, past: int = 0) -> np.ndarray:
    """``array`` in writable memory ``past`` bytes after a 64-byte boundary (0: aligned, as a
    request read from shared memory)."""
    room = np.empty(array.nbytes + 128, dtype=np.uint8)
    start = -room.ctypes.data % 64 + past
    aligned = room[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    aligned[...] = array
    return aligned


def test_aligned_writable_inputs_are_shared_with_tensorflow_and_never_written(
    loaded: dict[str, LoadedModel],
) -> None:
    model = loaded["tabular_mlp"]
    inputs = random_inputs(model.inputs, 64)
    shared = aligned_copy(inputs["features"])
    before = shared.copy()
    tensor = to_tensor(shared, tf.float32)
    assert np.shares_memory(np.from_dlpack(tensor), shared)
    answers = model.predict({"features": shared})
    assert np.array_equal(shared, before)
    assert np.abs(answers["probabilities"] - model.predict(inputs)["probabilities"]).max() <= TOLERANCE


@pytest.mark.parametrize(
    "make",
    [
        lambda a: aligned_copy(a, past=4),
        lambda a: np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape),  # read-only
        lambda a: np.asfortranarray(a),  # not C-contiguous
    ],
    ids=["unaligned", "read_only", "fortran_order"],
)
def test_inputs_tensorflow_cannot_take_as_they_are_are_copied_and_answer_alike(
    loaded: dict[str, LoadedModel], make: Callable[[np.ndarray], np.ndarray]
) -> None:
    model = loaded["tabular_mlp"]
    given = make(aligned_copy(random_inputs(model.inputs, 65)["features"]))
    tensor = to_tensor(given, tf.float32)
    assert not np.shares_memory(np.from_dlpack(tensor), given)
    expected = model.predict({"features": np.ascontiguousarray(given)})["probabilities"]
    assert np.array_equal(model.predict({"features": given})["probabilities"], expected)


def test_outputs_come_back_without_a_copy_and_strings_as_objects() -> None:
    numbers = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert np.shares_memory(to_numpy(numbers), np.from_dlpack(numbers))
    assert to_numpy(tf.constant([b"a", b"bc"])).tolist() == [b"a", b"bc"]
