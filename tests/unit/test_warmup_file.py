"""A version folder's ``warmup.json``: its samples replace config.yaml's for that version, it is
read within bounds and through the repository's trust rules, and a file that cannot be used
fails the load naming it from the repository down, the bound and what was expected."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import yaml

from udfserve.runtime.backends.warmup import warm_up
from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.repository import parse_model_config, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec, zeros
from udfserve.runtime.warmup_config import MAX_SAMPLE_ROWS, MAX_SAMPLES
from udfserve.runtime.warmup_file import MAX_WARMUP_FILE_BYTES, WARMUP_FILE_NAME, with_version_warmup

CONFIG_SAMPLES = 'warmup:\n  samples:\n    - {text: [["1"]]}\n'
SHOWN = "m/2/warmup.json"


def source_of(repository: Path, config: str = CONFIG_SAMPLES) -> ModelSource:
    """Version 2 of model ``m`` in ``repository``, its folder made, no file in it yet."""
    version_dir = repository / "m" / "2"
    version_dir.mkdir(parents=True, exist_ok=True)
    model_config: ModelConfig = parse_model_config(yaml.safe_load(config), "m/config.yaml")
    return ModelSource(name="m", version=2, path=version_dir, config=model_config, available_versions=(2,))


def write_file(source: ModelSource, content: object) -> Path:
    path = source.path / WARMUP_FILE_NAME
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def refusal(source: ModelSource) -> str:
    with pytest.raises(ModelLoadError) as caught:
        with_version_warmup(source)
    return str(caught.value)


def test_the_files_samples_replace_config_yamls_for_its_version(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, {"samples": [{"text": [["1.5"], ["-2"]]}, {"text": [["3"]]}]})

    warmup = with_version_warmup(source).config.warmup

    assert warmup.samples == ({"text": [["1.5"], ["-2"]]}, {"text": [["3"]]})
    assert warmup.samples_from == SHOWN


def test_a_version_without_the_file_keeps_config_yamls_samples(tmp_path: Path) -> None:
    source = source_of(tmp_path)

    warmup = with_version_warmup(source).config.warmup

    assert warmup.samples == ({"text": [["1"]]},) and warmup.samples_from == "config.yaml"


def test_warmup_false_in_config_yaml_wins_and_the_file_is_not_read(tmp_path: Path) -> None:
    source = source_of(tmp_path, "warmup: false\n")
    write_file(source, "not json at all")

    assert with_version_warmup(source) == source


def test_a_file_over_the_byte_bound_is_refused_unread_naming_the_bound(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, " " * (MAX_WARMUP_FILE_BYTES + 1))

    message = refusal(source)

    assert message.startswith(f"{SHOWN}: {MAX_WARMUP_FILE_BYTES + 1} bytes")
    assert f"expected at most {MAX_WARMUP_FILE_BYTES} bytes" in message


def test_more_samples_than_the_bound_are_refused_naming_it(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, {"samples": [{"text": [["1"]]}] * (MAX_SAMPLES + 1)})

    message = refusal(source)

    assert message.startswith(f"{SHOWN}: samples:") and f"at most {MAX_SAMPLES}" in message


def test_a_sample_of_more_rows_than_the_bound_is_refused_naming_it(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, {"samples": [{"text": [["1"]] * (MAX_SAMPLE_ROWS + 1)}]})

    message = refusal(source)

    assert message.startswith(SHOWN) and f"at most {MAX_SAMPLE_ROWS}" in message
    assert '["1"]' not in message  # the rows written are never echoed back


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"samples": [', "not JSON (line 1, column 14"),
        ("[" * 100_000 + "]" * 100_000, "RecursionError"),
        ('{"samples": [{"text": [[' + "9" * 5000 + "]]}]}", "ValueError"),
        ([{"text": [["1"]]}], "got list; expected a JSON object"),
        ({"samples": [{"text": [["1"]]}], "enabled": False}, "got ['enabled', 'samples']; expected"),
        ({"samples": []}, "samples is an empty list; expected a JSON object"),
        ({"samples": [{"text": "1"}]}, "samples.0.text: Input should be a valid list"),
        ({"samples": [{"text": [["1"]], "other": [[1], [2]]}]}, "expected the same number of rows"),
    ],
    ids=[
        "not_json",
        "nested_too_deep",
        "integer_of_too_many_digits",
        "not_an_object",
        "unknown_key",
        "no_sample",
        "rows_not_a_list",
        "row_counts_differ",
    ],
)
def test_a_file_not_of_the_samples_shape_is_refused_saying_what_was_expected(
    tmp_path: Path, content: object, expected: str
) -> None:
    source = source_of(tmp_path)
    write_file(source, content)

    message = refusal(source)

    assert message.startswith(f"{SHOWN}: ") and expected in message


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    (source.path / WARMUP_FILE_NAME).write_bytes(b'{"samples": "\xff"}')

    assert "not UTF-8" in refusal(source)


def test_a_symlink_out_of_the_repository_is_refused_unread(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"samples": [{"text": [["1"]]}]}), encoding="utf-8")
    source = source_of(tmp_path / "repository")
    (source.path / WARMUP_FILE_NAME).symlink_to(outside)

    message = refusal(source)

    assert message.startswith(SHOWN) and "outside the repository" in message


def test_a_symlink_inside_the_repository_is_followed(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    shared = write_file(source, {"samples": [{"text": [["7"]]}]}).rename(tmp_path / "m" / "shared.json")
    (source.path / WARMUP_FILE_NAME).symlink_to(shared)

    assert with_version_warmup(source).config.warmup.samples == ({"text": [["7"]]},)


def test_a_fifo_is_refused_without_blocking_the_load(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    os.mkfifo(source.path / WARMUP_FILE_NAME)

    assert "not a regular file" in refusal(source)


class Refusing:
    """A model of one string input ``text`` that refuses the string ``one``, as a cast would."""

    inputs = (TensorSpec(name="text", dtype="string", shape=(1,)),)
    outputs = (TensorSpec(name="value", dtype="float32", shape=(1,)),)

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = list(inputs["text"].reshape(-1))
        if b"one" in values:
            raise ValueError("cannot cast 'one' to a number")
        return {"value": np.zeros((len(values), 1), dtype=np.float32)}


def test_a_failing_sample_of_the_file_is_named_by_the_file(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, {"samples": [{"text": [["1"]]}, {"text": [["one"]]}]})
    config = with_version_warmup(source).config
    model = Refusing()

    with pytest.raises(ModelLoadError) as caught:
        warm_up(
            model,
            lambda rows: {spec.name: zeros(spec, rows) for spec in model.inputs},
            config.warmup,
            config.max_batch_size,
            "model 'm' version 2",
        )

    assert f"the warm-up call of 1 row(s) of sample 1 of {SHOWN} failed" in str(caught.value)


def test_a_sample_of_the_file_that_does_not_fit_is_named_by_the_file(tmp_path: Path) -> None:
    source = source_of(tmp_path)
    write_file(source, {"samples": [{"words": [["1"]]}]})
    config = with_version_warmup(source).config
    model = Refusing()

    with pytest.raises(ModelLoadError) as caught:
        warm_up(model, lambda rows: {}, config.warmup, config.max_batch_size, "model 'm' version 2")

    assert f"warm-up sample 0 of {SHOWN} names inputs ['words']" in str(caught.value)


def test_writing_the_file_changes_the_versions_fingerprint_so_a_watching_server_reloads_it(
    tmp_path: Path,
) -> None:
    source = source_of(tmp_path)
    (source.path / "model.onnx").write_bytes(b"a graph")
    before = scan_repository(tmp_path).sources[0].fingerprint

    write_file(source, {"samples": [{"text": [["1"]]}]})

    assert scan_repository(tmp_path).sources[0].fingerprint != before
