"""``udfserve models import-hf``: a fine-tuned Hugging Face classifier folder (made here as
``save_pretrained`` makes one: random seeded weights, a tokenizer trained on generated text)
becomes a model of the repository whose exported graph, fed by the server's tokenization, answers
what transformers answers in-process; folders it cannot import safely are refused, naming why."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.preprocessing import BatchTokenizer, open_tokenizer
from udfserve.runtime.repository import scan_repository
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.examples.text_classifier import MAX_LENGTH, generated_texts, write_fine_tuned_folder
from udfserve.services.hf_import import HfImportError, import_hugging_face

TOLERANCE = 1e-5
FEEDS = (
    TensorSpec(name="input_ids", dtype="int64", shape=(-1,)),
    TensorSpec(name="attention_mask", dtype="int64", shape=(-1,)),
)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fine_tuned_folder(tmp_path_factory.mktemp("hf") / "fine_tuned")


@pytest.fixture(scope="module")
def repository(fine_tuned: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    import_hugging_face(fine_tuned, root, "reviews_onnx", model_format="onnx", max_length=MAX_LENGTH)
    import_hugging_face(fine_tuned, root, "reviews_pt2", model_format="pt2", max_length=MAX_LENGTH)
    return root


def transformers_probabilities(folder: Path, texts: Sequence[str], max_length: int) -> np.ndarray:
    """What the fine-tuned model computes in-process, tokenized by transformers, 256 texts a batch."""
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    parts = []
    with torch.inference_mode():
        for start in range(0, len(texts), 256):
            batch = tokenizer(
                list(texts[start : start + 256]),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            parts.append(torch.softmax(model(**batch).logits, dim=-1).numpy())
    return np.concatenate(parts)


def server_tokenizer(model_dir: Path) -> BatchTokenizer:
    config = scan_repository(model_dir.parent, [model_dir.name]).models[0].config
    assert config.preprocess is not None
    return open_tokenizer(model_dir / "1" / config.preprocess.tokenizer, config.preprocess, FEEDS, "test")


def as_bytes(texts: Sequence[str]) -> np.ndarray:
    return np.array([text.encode() for text in texts], dtype=object)


TEXTS = [*generated_texts(1_000, seed=11), "", "unseen words: zyzzyva, qwerty", "good " * 200]


def test_the_version_holds_the_model_file_and_its_tokenizer_and_the_config_tokenizes_text(
    repository: Path,
) -> None:
    scan = scan_repository(repository)

    assert scan.failures == {}
    by_name = {source.name: source for source in scan.sources}
    assert sorted(p.name for p in (repository / "reviews_onnx" / "1").iterdir()) == [
        "model.onnx",
        "tokenizer.json",
    ]
    assert sorted(p.name for p in (repository / "reviews_pt2" / "1").iterdir()) == [
        "model.pt2",
        "tokenizer.json",
    ]
    assert by_name["reviews_onnx"].backend == "onnxruntime"
    assert by_name["reviews_pt2"].backend == "pytorch"
    assert by_name["reviews_onnx"].config.preprocess is not None
    assert by_name["reviews_onnx"].config.preprocess.model_dump() == {
        "tokenizer": "tokenizer.json",
        "input": "text",
        "max_length": MAX_LENGTH,
        "max_characters": None,
        "pad_token": "[PAD]",
        "outputs": ("input_ids", "attention_mask"),
    }


def test_the_servers_tokenization_equals_transformers(repository: Path, fine_tuned: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(fine_tuned, local_files_only=True)

    fed = server_tokenizer(repository / "reviews_onnx")(as_bytes(TEXTS[:300]))

    expected = tokenizer(
        TEXTS[:300], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="np"
    )
    assert np.array_equal(fed["input_ids"], expected["input_ids"])
    assert np.array_equal(fed["attention_mask"], expected["attention_mask"])


def test_the_onnx_export_fed_by_the_servers_tokenization_answers_like_transformers(
    repository: Path, fine_tuned: Path
) -> None:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(repository / "reviews_onnx" / "1" / "model.onnx"))
    tokenize = server_tokenizer(repository / "reviews_onnx")

    found = np.concatenate(
        [
            session.run(["probabilities"], tokenize(as_bytes(TEXTS[start : start + 100])))[0]
            for start in range(0, len(TEXTS), 100)
        ]
    )

    np.testing.assert_allclose(
        found, transformers_probabilities(fine_tuned, TEXTS, MAX_LENGTH), atol=TOLERANCE
    )


def test_the_torch_export_fed_by_the_servers_tokenization_answers_like_transformers(
    repository: Path, fine_tuned: Path
) -> None:
    program = torch.export.load(str(repository / "reviews_pt2" / "1" / "model.pt2")).module()
    tokenize = server_tokenizer(repository / "reviews_pt2")

    with torch.inference_mode():
        found = np.concatenate(
            [
                program(
                    *(
                        torch.from_numpy(array)
                        for array in tokenize(as_bytes(TEXTS[start : start + 100])).values()
                    )
                )["probabilities"].numpy()
                for start in range(0, len(TEXTS), 100)
            ]
        )

    np.testing.assert_allclose(
        found, transformers_probabilities(fine_tuned, TEXTS, MAX_LENGTH), atol=TOLERANCE
    )


def test_the_command_imports_the_next_version_and_never_rewrites_one(
    fine_tuned: Path, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "udfserve",
        "models",
        "import-hf",
        str(fine_tuned),
        "--repository",
        str(tmp_path),
        "--name",
        "reviews",
    ]

    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    again = subprocess.run([*command, "--version", "1"], capture_output=True, text=True, timeout=300)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in (tmp_path / "reviews").iterdir()) == ["1", "2", "config.yaml"]
    assert again.returncode == 1
    assert f"{tmp_path / 'reviews' / '1'} exists: a version is never rewritten in place" in again.stderr


def test_pickled_weights_are_refused_and_never_unpickled(fine_tuned: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((fine_tuned / name).read_bytes())
    marker = tmp_path / "code_ran"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCode(str(marker))))

    with pytest.raises(
        HfImportError,
        match=r"lacks model.safetensors \(pytorch_model.bin are pickle files, which are never loaded",
    ):
        import_hugging_face(folder, tmp_path / "repository", "m")

    assert not marker.exists()


def test_a_folder_without_a_fast_tokenizer_is_refused_naming_it(fine_tuned: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((fine_tuned / name).read_bytes())

    with pytest.raises(
        HfImportError, match=rf"{folder} lacks tokenizer.json; expected a folder written by save_pretrained"
    ):
        import_hugging_face(folder, tmp_path / "repository", "m")


def test_the_config_written_is_what_the_server_reads(repository: Path) -> None:
    import yaml

    text = (repository / "reviews_onnx" / "config.yaml").read_text()

    assert text.startswith(
        "# A Hugging Face text classifier: one string per row in (text), probabilities of the labels "
        "negative, neutral, positive out."
    )
    assert ModelConfig.model_validate(yaml.safe_load(text)).max_batch_size == 256


def test_a_tokenizer_listing_token_type_ids_first_feeds_each_input_by_its_name(
    fine_tuned: Path, tmp_path: Path
) -> None:
    """BERT's own tokenizers list input_ids, token_type_ids, attention_mask: the export takes them
    by name, whatever their order, and the server feeds all three."""
    import json

    import onnxruntime

    folder = tmp_path / "bert_order"
    shutil.copytree(fine_tuned, folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    imported = import_hugging_face(folder, tmp_path / "repository", "bert_order", max_length=MAX_LENGTH)

    assert imported.feeds == ("input_ids", "attention_mask", "token_type_ids")
    session = onnxruntime.InferenceSession(str(imported.version_dir / "model.onnx"))
    assert [node.name for node in session.get_inputs()] == list(imported.feeds)
    feeds = tuple(TensorSpec(name=name, dtype="int64", shape=(-1,)) for name in imported.feeds)
    config = scan_repository(tmp_path / "repository").models[0].config
    assert config.preprocess is not None and config.preprocess.outputs == imported.feeds
    tokenize = open_tokenizer(imported.version_dir / "tokenizer.json", config.preprocess, feeds, "test")
    (found,) = session.run(["probabilities"], tokenize(as_bytes(TEXTS[:300])))
    np.testing.assert_allclose(
        found, transformers_probabilities(folder, TEXTS[:300], MAX_LENGTH), atol=TOLERANCE
    )


def test_max_length_beyond_the_models_positions_is_refused_before_anything_is_written(
    fine_tuned: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        HfImportError, match=r"max_length 4096: expected 1 to 128 tokens \(the model has 128 positions\)"
    ):
        import_hugging_face(fine_tuned, tmp_path, "too_long", max_length=4096)

    assert list((tmp_path).iterdir()) == []


class _RunsCode:
    """A pickle that runs code when it is loaded: it creates a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (Path(self.path),))  # type: ignore[return-value]
