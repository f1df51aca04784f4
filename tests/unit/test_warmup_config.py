"""``warmup:`` in config.yaml: the flag it always was, or a section naming samples; and what the
warm-up does with each, through ``warm_up`` and a model that records its calls or fails as a
device out of memory would."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import yaml

from udfserve.runtime.backends.warmup import MAX_INPUT_BYTES, WarmupInputs, warm_up
from udfserve.runtime.errors import DeviceOutOfMemory, ModelLoadError
from udfserve.runtime.repository import parse_model_config
from udfserve.runtime.tensor_spec import TensorSpec, zeros
from udfserve.runtime.warmup_config import MAX_SAMPLE_ROWS, WarmupConfig


def config_of(text: str) -> WarmupConfig:
    return parse_model_config(yaml.safe_load(text), "m/config.yaml").warmup


class Recording:
    """A model of one string input ``text`` (per-row shape (1,)) that records the rows of each call
    and fails the calls ``fails`` says with what it gives."""

    def __init__(self, fails: Exception | None = None, on_strings: bytes | None = None) -> None:
        self.inputs = (TensorSpec(name="text", dtype="string", shape=(1,)),)
        self.outputs = (TensorSpec(name="value", dtype="float32", shape=(1,)),)
        self.calls: list[list[bytes]] = []
        self._fails = fails
        self._on_strings = on_strings

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = list(inputs["text"].reshape(-1))
        self.calls.append(values)
        if self._fails is not None and (self._on_strings is None or self._on_strings in values):
            raise self._fails
        return {"value": np.zeros((len(values), 1), dtype=np.float32)}


def synthetic(model: Recording) -> WarmupInputs:
    return lambda rows: {spec.name: zeros(spec, rows) for spec in model.inputs}


def test_true_and_false_keep_their_meaning() -> None:
    assert config_of("warmup: true") == WarmupConfig(enabled=True)
    assert config_of("warmup: false") == WarmupConfig(enabled=False)
    assert config_of("max_batch_size: 8") == WarmupConfig(enabled=True)


def test_the_section_names_samples_by_input_and_rows() -> None:
    config = config_of('warmup:\n  samples:\n    - {text: [["1.5"], ["2"]]}\n')

    assert config.enabled and config.samples == ({"text": [["1.5"], ["2"]]},)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("warmup: 1", "warmup"),
        ("warmup: {samples: [{}]}", "warm-up sample 0: expected each of the model's inputs"),
        ("warmup: {samples: [{a: [1, 2], b: [1]}]}", "expected the same number of rows for every input"),
        (f"warmup: {{samples: [{{a: {[0] * (MAX_SAMPLE_ROWS + 1)}}}]}}", f"at most {MAX_SAMPLE_ROWS}"),
        ("warmup: {sample: []}", "warmup.sample"),
    ],
    ids=["number", "empty_sample", "uneven_rows", "too_many_rows", "unknown_key"],
)
def test_a_warmup_that_is_no_flag_nor_section_is_refused_naming_it(text: str, expected: str) -> None:
    with pytest.raises(ValueError, match=r"m/config\.yaml") as caught:
        parse_model_config(yaml.safe_load(text), "m/config.yaml")

    assert expected in str(caught.value)


def test_a_sample_warms_up_as_written_then_repeated_to_the_largest_batch() -> None:
    model = Recording()
    config = WarmupConfig(samples=({"text": [["1.5"], ["2"], ["3"]]},))

    warm_up(model, synthetic(model), config, 8, "model 'm' version 1")

    assert model.calls == [[b"1.5", b"2", b"3"], [b"1.5", b"2", b"3"] * 2 + [b"1.5", b"2"]]


def test_a_disabled_warmup_makes_no_call() -> None:
    model = Recording(fails=RuntimeError("never"))

    warm_up(model, synthetic(model), WarmupConfig(enabled=False), 8, "model 'm' version 1")

    assert model.calls == []


def test_a_synthetic_failure_on_guessed_strings_is_a_warning_and_stops_the_warmup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Recording(fails=ValueError("stod"))

    warm_up(model, synthetic(model), WarmupConfig(), 8, "model 'm' version 1")

    assert model.calls == [[b""]]
    assert "model 'm' version 1: loaded without a warm-up" in caplog.text and "stod" in caplog.text


def test_running_out_of_device_memory_fails_the_load_even_on_guessed_values() -> None:
    model = Recording(fails=DeviceOutOfMemory("out of memory allocating 8 rows"))

    with pytest.raises(ModelLoadError, match="of zeros failed: out of memory allocating 8 rows"):
        warm_up(model, synthetic(model), WarmupConfig(), 8, "model 'm' version 1")


def test_a_sample_failing_in_the_largest_call_fails_the_load_naming_the_rows() -> None:
    model = Recording(fails=ValueError("no room"), on_strings=b"1.5")
    config = WarmupConfig(samples=({"text": [["2"]]}, {"text": [["1.5"]]}))

    with pytest.raises(ModelLoadError, match=r"1 row\(s\) of sample 1 of config.yaml failed: no room"):
        warm_up(model, synthetic(model), config, 8, "model 'm' version 1")


def test_a_sample_of_more_rows_than_max_batch_size_is_refused() -> None:
    model = Recording()
    config = WarmupConfig(samples=({"text": [["1"]] * 9},))

    with pytest.raises(ModelLoadError, match=r"9 rows; expected at most max_batch_size \(8\)"):
        warm_up(model, synthetic(model), config, 8, "model 'm' version 1")


def test_long_sample_strings_count_their_bytes_against_the_bound() -> None:
    model = Recording()
    text = "1" * (MAX_INPUT_BYTES // 4)
    config = WarmupConfig(samples=({"text": [[text]]},))

    warm_up(model, synthetic(model), config, 1024, "model 'm' version 1")

    assert [len(call) for call in model.calls] == [1, 3]
