"""The warm-up is a check that never refuses a model real requests can serve: a synthetic call
that fails on values it guessed (strings, integers, free lengths) is a warning and the model
loads; one that fails on values fitted to the model, or a sample config.yaml names, fails the
load. Real ONNX graphs, loaded by the ONNX Runtime backend, and a TensorFlow SavedModel with a
``tf.string`` input."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper
from onnx_graphs import casting_graph, model_of, write_model

from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.repository import load_model, scan_repository

TESTS_DIR = Path(__file__).resolve().parents[1]
SAMPLES = 'warmup:\n  samples:\n    - {text: [["1.5"], ["-2"]]}\n'


def load(root: Path, name: str) -> LoadedModel:
    scan = scan_repository(root, only=[name])
    assert scan.failures == {}
    return load_model(scan.sources[0])


def refusal(root: Path, name: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load(root, name)
    return str(caught.value)


def texts(*values: str) -> np.ndarray:
    return np.array([[value.encode()] for value in values], dtype=object)


def test_a_model_casting_strings_to_numbers_loads_with_a_warning_and_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "casting", casting_graph())

    with caplog.at_level(logging.WARNING):
        model = load(tmp_path, "casting")

    answer = model.predict({"text": texts("1.5", "-2", "1e3")})["value"]
    np.testing.assert_array_equal(answer, [[1.5], [-2.0], [1000.0]])
    warning = caplog.text
    assert "loaded without a warm-up" in warning and "text (strings" in warning
    assert "`warmup: {samples: [...]}`" in warning


def test_a_string_the_model_cannot_cast_is_refused_as_the_requests_input(tmp_path: Path) -> None:
    write_model(tmp_path, "casting", casting_graph())

    with pytest.raises(InvalidInput) as caught:
        load(tmp_path, "casting").predict({"text": texts("1.5", "one")})

    assert "'casting'" in str(caught.value)


def test_samples_named_in_config_warm_the_model_up_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "casting", casting_graph(), config=SAMPLES)

    with caplog.at_level(logging.WARNING):
        model = load(tmp_path, "casting")

    assert "warm-up" not in caplog.text
    np.testing.assert_array_equal(model.predict({"text": texts("4")})["value"], [[4.0]])


def test_a_sample_the_model_refuses_fails_the_load_naming_it(tmp_path: Path) -> None:
    config = 'warmup:\n  samples:\n    - {text: [["1.5"]]}\n    - {text: [["one"]]}\n'
    write_model(tmp_path, "casting", casting_graph(), config=config)

    message = refusal(tmp_path, "casting")

    assert "the warm-up call of 1 row(s) of sample 1 of config.yaml failed" in message
    assert "expected a sample the model takes" in message


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("{words: [[a]]}", "names inputs ['words']; expected the model's inputs ['text']"),
        ("{text: [[1.5]]}", "expected strings"),
        ('{text: [["1", "2"]]}', "its rows are of shape (2,); expected (1,)"),
    ],
    ids=["unknown_input", "number_for_string", "other_shape"],
)
def test_a_sample_that_does_not_fit_the_inputs_fails_the_load_naming_what_was_expected(
    tmp_path: Path, sample: str, expected: str
) -> None:
    write_model(tmp_path, "casting", casting_graph(), config=f"warmup:\n  samples:\n    - {sample}\n")

    message = refusal(tmp_path, "casting")

    assert "warm-up sample 0" in message and expected in message


def test_an_integer_model_refusing_zeros_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "lookup", _lookup_graph(TensorProto.INT64))

    with caplog.at_level(logging.WARNING):
        model = load(tmp_path, "lookup")

    np.testing.assert_array_equal(model.predict({"x": np.array([5, 6], dtype=np.int64)})["y"], [10, 20])
    assert "x (integers: a model may use them as indices or ids)" in caplog.text


def test_a_float_model_of_fixed_shapes_failing_on_zeros_is_refused(tmp_path: Path) -> None:
    """Zeros of the declared shapes fit any model of float inputs: a failure says the model is
    broken, and a new version that fails must not replace one that serves."""
    write_model(tmp_path, "broken", _lookup_graph(TensorProto.FLOAT))

    message = refusal(tmp_path, "broken")

    assert "the warm-up call of 1 row(s) of zeros failed" in message
    assert "`warmup: {samples: [...]}`" in message and "`warmup: false` loads it without" in message


def test_warmup_false_loads_without_any_call(tmp_path: Path) -> None:
    write_model(tmp_path, "cold", _lookup_graph(TensorProto.FLOAT), config="warmup: false\n")

    model = load(tmp_path, "cold")

    np.testing.assert_array_equal(model.predict({"x": np.array([5.0], dtype=np.float32)})["y"], [10.0])


def test_a_savedmodel_casting_tf_strings_to_numbers_loads_and_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    subprocess.run(
        [sys.executable, str(TESTS_DIR / "casting_savedmodel.py"), str(tmp_path / "casting_tf" / "1")],
        check=True,
        capture_output=True,
        timeout=300,
    )

    with caplog.at_level(logging.WARNING):
        model = load(tmp_path, "casting_tf")

    answer = model.predict({"text": np.array([b"2.5", b"-1"], dtype=object)})["value"]
    np.testing.assert_array_equal(answer, [2.5, -1.0])
    assert "loaded without a warm-up" in caplog.text


def _lookup_graph(elem_type: int) -> ModelProto:
    """y = [10, 20][x - 5] (x cast to int64 first): 5 and 6 are answered, 0 reads out of range."""
    nodes = [
        helper.make_node("Cast", ["x"], ["whole"], to=TensorProto.INT64),
        helper.make_node("Sub", ["whole", "five"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["gathered"]),
        helper.make_node("Cast", ["gathered"], ["y"], to=elem_type),
    ]
    graph = helper.make_graph(
        nodes,
        "lookup",
        [helper.make_tensor_value_info("x", elem_type, ["batch"])],
        [helper.make_tensor_value_info("y", elem_type, ["batch"])],
        initializer=[
            numpy_helper.from_array(np.array([10, 20], dtype=np.int64), "table"),
            numpy_helper.from_array(np.array(5, dtype=np.int64), "five"),
        ],
    )
    return model_of(graph)
