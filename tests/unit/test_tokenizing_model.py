"""A model behind config.yaml's ``preprocess`` step takes one string per row: the server tokenizes
each batch with the model's own tokenizer file (a real one, trained here with ``tokenizers``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.model_config import ModelConfig, TextPreprocess
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.preprocessing import TokenizingModel, with_preprocessing
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.examples.text_classifier import generated_texts, train_tokenizer


class TokenCounter:
    """A model of two integer sequence inputs that answers the real tokens of each row, and keeps
    the last inputs it was fed."""

    platform = "test"

    def __init__(self, dtype: str = "int64", length: int = -1, names: tuple[str, ...] = ()) -> None:
        self.name = "classifier"
        self.version = 1
        self.inputs = tuple(
            TensorSpec(name=name, dtype=dtype, shape=(length,))
            for name in names or ("input_ids", "attention_mask")
        )
        self.outputs = (TensorSpec(name="tokens", dtype="int64", shape=()),)
        self.fed: dict[str, np.ndarray] = {}

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.fed = dict(inputs)
        return {"tokens": inputs["attention_mask"].sum(axis=1).astype(np.int64)}


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("text_model") / "1"
    folder.mkdir()
    train_tokenizer(generated_texts(500)).save(str(folder / "tokenizer.json"))
    return folder


def wrapped(model: TokenCounter, version_dir: Path, **step: object) -> TokenizingModel:
    source = ModelSource(
        name="classifier",
        version=1,
        path=version_dir,
        config=ModelConfig.model_validate({"preprocess": step}),
        available_versions=(1,),
    )
    result = with_preprocessing(model, source)
    assert isinstance(result, TokenizingModel)
    return result


def texts(*values: str) -> np.ndarray:
    return np.array([value.encode() for value in values], dtype=object)


def test_the_public_input_is_one_string_per_row_and_the_outputs_are_the_models(version_dir: Path) -> None:
    model = wrapped(TokenCounter(), version_dir)

    assert [spec.model_dump() for spec in model.inputs] == [
        {"name": "text", "dtype": "string", "shape": (), "range": None}
    ]
    assert model.outputs == TokenCounter().outputs


def test_a_batch_is_fed_as_the_tokenizer_encodes_it_padded_to_its_longest_text(version_dir: Path) -> None:
    counter = TokenCounter()
    batch = ["The movie was very good", "Dull.", "The plot felt rather long, the ending was not surprising"]

    answer = wrapped(counter, version_dir, max_length=64).predict({"text": texts(*batch)})

    reference = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
    reference.enable_padding(pad_id=reference.token_to_id("[PAD]"), pad_token="[PAD]")
    expected = reference.encode_batch(batch)
    assert counter.fed["input_ids"].dtype == np.int64
    assert counter.fed["input_ids"].tolist() == [encoding.ids for encoding in expected]
    assert counter.fed["attention_mask"].tolist() == [encoding.attention_mask for encoding in expected]
    assert answer["tokens"].tolist() == [sum(encoding.attention_mask) for encoding in expected]


def test_a_text_longer_than_max_length_is_truncated_keeping_its_special_tokens(version_dir: Path) -> None:
    counter = TokenCounter()
    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))

    wrapped(counter, version_dir, max_length=8).predict({"text": texts("good " * 100, "bad")})

    ids = counter.fed["input_ids"]
    assert ids.shape == (2, 8)
    assert ids[0, 0] == tokenizer.token_to_id("[CLS]") and ids[0, -1] == tokenizer.token_to_id("[SEP]")
    assert counter.fed["attention_mask"].sum(axis=1).tolist() == [8, 3]


def test_the_models_integer_dtype_and_fixed_length_are_honoured(version_dir: Path) -> None:
    counter = TokenCounter(dtype="int32", length=16)

    wrapped(counter, version_dir, max_length=16).predict({"text": texts("Short.", "")})

    assert counter.fed["input_ids"].dtype == np.int32
    assert counter.fed["input_ids"].shape == counter.fed["attention_mask"].shape == (2, 16)


def test_the_token_type_ids_are_fed_when_the_step_names_them(version_dir: Path) -> None:
    counter = TokenCounter(names=("input_ids", "token_type_ids", "attention_mask"))

    wrapped(counter, version_dir, outputs=["input_ids", "attention_mask", "token_type_ids"]).predict(
        {"text": texts("fine", "awful plot")}
    )

    assert counter.fed["token_type_ids"].tolist() == np.zeros_like(counter.fed["input_ids"]).tolist()


def test_text_beyond_ascii_is_tokenized_from_its_utf8_bytes(version_dir: Path) -> None:
    counter = TokenCounter()

    wrapped(counter, version_dir).predict({"text": texts("délicieux, schön")})

    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
    assert counter.fed["input_ids"].tolist() == [tokenizer.encode("délicieux, schön").ids]


def test_bytes_that_are_not_utf8_are_refused_naming_the_row(version_dir: Path) -> None:
    model = wrapped(TokenCounter(), version_dir)
    batch = np.array([b"good", b"ok", b"\xff\xfe broken"], dtype=object)

    with pytest.raises(
        InvalidInput, match=r"input 'text' row 2 is not UTF-8 text \(invalid start byte at byte 0\)"
    ):
        model.predict({"text": batch})


def test_a_batch_without_the_text_input_is_refused_naming_it(version_dir: Path) -> None:
    model = wrapped(TokenCounter(), version_dir)

    with pytest.raises(InvalidInput, match=r"missing input 'text'; expected one string column named 'text'"):
        model.predict({"input_ids": np.zeros((1, 3), dtype=np.int64)})


def test_a_model_whose_inputs_the_step_does_not_feed_fails_its_load_naming_both(version_dir: Path) -> None:
    with pytest.raises(
        ModelLoadError,
        match=r"feeds \['input_ids', 'attention_mask'\].*model's inputs are \['input_ids', 'pixel_values'\]",
    ):
        wrapped(TokenCounter(names=("input_ids", "pixel_values")), version_dir)


def test_a_model_of_float_inputs_fails_its_load(version_dir: Path) -> None:
    with pytest.raises(
        ModelLoadError, match=r"not integer sequences: input_ids \(float32, per-row shape \[-1\]\)"
    ):
        wrapped(TokenCounter(dtype="float32"), version_dir)


def test_max_length_beyond_the_models_fixed_length_fails_its_load(version_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"max_length is 128 but the model takes 16 tokens a text"):
        wrapped(TokenCounter(length=16), version_dir, max_length=128)


def test_a_missing_tokenizer_file_fails_the_load_naming_it(version_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=rf"no tokenizer file {version_dir / 'vocab.json'}"):
        wrapped(TokenCounter(), version_dir, tokenizer="vocab.json")


def test_a_tokenizer_file_that_does_not_parse_fails_the_load_naming_it(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": ')

    with pytest.raises(ModelLoadError, match=rf"cannot read the tokenizer {tmp_path / 'tokenizer.json'}: .*"):
        wrapped(TokenCounter(), tmp_path)


def test_a_pad_token_the_tokenizer_lacks_fails_the_load_naming_it(version_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"has no token '<pad>' \(preprocess.pad_token\)"):
        wrapped(TokenCounter(), version_dir, pad_token="<pad>")


def test_a_config_without_a_step_leaves_the_model_as_it_is(version_dir: Path) -> None:
    counter = TokenCounter()
    source = ModelSource(name="m", version=1, path=version_dir, config=ModelConfig(), available_versions=(1,))

    assert with_preprocessing(counter, source) is counter


def test_texts_are_tokenized_alike_from_several_threads(version_dir: Path) -> None:
    """The server runs a model's batches from several worker threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    model = wrapped(TokenCounter(), version_dir)
    batches = [texts(*generated_texts(200, seed)) for seed in range(16)]
    alone = [model.tokenize(batch)["input_ids"].tolist() for batch in batches]

    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda batch: model.tokenize(batch)["input_ids"].tolist(), batches))

    assert together == alone


def test_the_step_is_what_the_config_declared(version_dir: Path) -> None:
    model = wrapped(TokenCounter(), version_dir, max_length=32)

    assert model.tokenize.step == TextPreprocess(max_length=32)


def test_a_text_is_cut_to_max_characters_before_it_is_tokenized(version_dir: Path) -> None:
    """What lies past the cut is never tokenized: a client cannot make the server tokenize a
    megabyte to keep a few tokens."""
    counter = TokenCounter()
    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))

    wrapped(counter, version_dir, max_characters=9).predict({"text": texts("good bad " + "awful " * 1000)})

    assert counter.fed["input_ids"].tolist() == [tokenizer.encode("good bad ").ids]


def test_a_text_is_cut_by_default_at_32_characters_a_token(version_dir: Path) -> None:
    step = TextPreprocess(max_length=64)

    assert step.characters == 32 * 64
