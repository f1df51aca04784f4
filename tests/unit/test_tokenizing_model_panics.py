"""A tokenizer.json the ``tokenizers`` library panics on (``PanicException``, a ``BaseException``):
read at load, the load fails naming the file; on a text, that batch fails ``ModelAborted``
naming the model and the tokenizer, and the model encodes the next text. The files are the
example text classifier's real tokenizer, edited (``tokenizer_files``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import grpc
import numpy as np
import pytest
from tokenizer_files import (
    PANICKING_TEXT,
    example_tokenizer,
    with_backtracking_normalizer,
    with_corrupt_charsmap,
)
from tokenizers import Tokenizer

from udfserve.runtime.errors import ModelAborted, ModelLoadError
from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.preprocessing import TokenizingModel, with_preprocessing
from udfserve.runtime.tensor_spec import TensorSpec


class TokenCounter:
    """A model of ``input_ids`` and ``attention_mask`` that answers each row's real tokens."""

    name = "reviews"
    version = 1
    platform = "test"
    inputs: tuple[TensorSpec, ...] = (
        TensorSpec(name="input_ids", dtype="int64", shape=(-1,)),
        TensorSpec(name="attention_mask", dtype="int64", shape=(-1,)),
    )
    outputs: tuple[TensorSpec, ...] = (TensorSpec(name="tokens", dtype="int64", shape=()),)

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"tokens": inputs["attention_mask"].sum(axis=1).astype(np.int64)}


@pytest.fixture(scope="module")
def tokenizer() -> dict[str, object]:
    return example_tokenizer()


def source_with(folder: Path, tokenizer: dict[str, object]) -> ModelSource:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return ModelSource(
        name="reviews",
        version=1,
        path=folder,
        config=ModelConfig.model_validate({"preprocess": {"max_length": 32}}),
        available_versions=(1,),
    )


def panic_of(call: object) -> BaseException:
    """What ``call()`` raised; it must raise."""
    try:
        call()  # type: ignore[operator]
    except BaseException as raised:  # the point: a panic is no Exception
        return raised
    raise AssertionError("it did not raise")


def test_this_tokenizers_version_panics_on_both_files(tokenizer: dict[str, object]) -> None:
    """The premise of the tests: a panic, not an Exception, for the text and for the charsmap."""
    hostile = Tokenizer.from_str(json.dumps(with_backtracking_normalizer(tokenizer)))

    on_text = panic_of(lambda: hostile.encode_batch_fast([PANICKING_TEXT]))
    on_read = panic_of(lambda: Tokenizer.from_str(json.dumps(with_corrupt_charsmap(tokenizer))))

    assert len(PANICKING_TEXT.encode()) == 41
    assert [type(on_text).__name__, type(on_read).__name__] == ["PanicException", "PanicException"]
    assert not isinstance(on_text, Exception) and not isinstance(on_read, Exception)


def test_a_text_the_tokenizer_panics_on_fails_the_batch_naming_the_model_and_the_tokenizer(
    tokenizer: dict[str, object], tmp_path: Path
) -> None:
    model = with_preprocessing(
        TokenCounter(), source_with(tmp_path / "1", with_backtracking_normalizer(tokenizer))
    )
    assert isinstance(model, TokenizingModel)

    with pytest.raises(ModelAborted) as raised:
        model.predict({"text": np.array([PANICKING_TEXT.encode()], dtype=object)})

    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'reviews': its tokenizer tokenizer.json panicked on this batch: PanicException" in str(
        raised.value
    )


def test_after_a_panic_the_tokenizer_encodes_the_next_text(
    tokenizer: dict[str, object], tmp_path: Path
) -> None:
    model = with_preprocessing(
        TokenCounter(), source_with(tmp_path / "1", with_backtracking_normalizer(tokenizer))
    )
    with pytest.raises(ModelAborted):
        model.predict({"text": np.array([PANICKING_TEXT.encode()], dtype=object)})

    answer = model.predict({"text": np.array([b"the movie was great", b"dull"], dtype=object)})

    assert answer["tokens"].tolist() == [6, 3]  # [CLS] ... [SEP]


def test_a_tokenizer_file_that_panics_when_read_fails_the_load_naming_the_file(
    tokenizer: dict[str, object], tmp_path: Path
) -> None:
    source = source_with(tmp_path / "1", with_corrupt_charsmap(tokenizer))

    with pytest.raises(ModelLoadError) as raised:
        with_preprocessing(TokenCounter(), source)

    assert (
        f"model 'reviews' version 1: cannot read the tokenizer {tmp_path / '1' / 'tokenizer.json'}: "
        "the tokenizers library panicked: PanicException"
    ) in str(raised.value)
