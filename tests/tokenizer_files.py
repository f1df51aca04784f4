"""Text models whose tokenizer.json makes the ``tokenizers`` library panic, for the tests of what a
server and the runtime do then.

Each file starts as the example text classifier's real tokenizer (``train_tokenizer``, WordPiece
trained on the generated sentences) and is edited as its JSON could be by hand or by a broken
export. The model behind it is a small ONNX graph that counts each text's tokens: the tokenizer
is what is under test, and a graph of two nodes loads in milliseconds where the exported BERT of
the example takes a torch export.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper
from onnx_graphs import model_of

from udfserve.services.examples.text_classifier import generated_texts, train_tokenizer

BACKTRACKING_PATTERN = "(a+)+b"
"""A normalizer regex that backtracks exponentially on a run of ``a`` with no ``b`` after it."""
PANICKING_TEXT = "a" * 40 + "!"
"""41 bytes on which the backtracking regex gives up (Oniguruma's retry limit) and the library
panics: ``PanicException``."""
CORRUPT_CHARSMAP = base64.b64encode(b"\xff\xff\xff\x7f" + b"\x00" * 12).decode("ascii")
"""A ``precompiled_charsmap`` whose trie claims 2 GiB and holds 12 bytes: the library cannot parse
it, and panics where it reads the file (``Precompiled: Error("Cannot parse precompiled_charsmap")``)."""
TEXT_CONFIG = """\
max_batch_size: 16
preprocess:
  tokenizer: tokenizer.json
  input: text
  max_length: 32
  pad_token: '[PAD]'
  outputs: [input_ids, attention_mask]
"""


def example_tokenizer() -> dict[str, Any]:
    """The example text classifier's tokenizer, as its tokenizer.json holds it."""
    parsed: dict[str, Any] = json.loads(train_tokenizer(generated_texts(500)).to_str())
    return parsed


def with_backtracking_normalizer(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer`` whose normalizer first removes ``BACKTRACKING_PATTERN``'s matches."""
    replace = {"type": "Replace", "pattern": {"Regex": BACKTRACKING_PATTERN}, "content": ""}
    return {
        **tokenizer,
        "normalizer": {"type": "Sequence", "normalizers": [replace, tokenizer["normalizer"]]},
    }


def with_corrupt_charsmap(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer`` whose normalizer starts with a SentencePiece ``Precompiled`` step whose
    ``precompiled_charsmap`` is ``CORRUPT_CHARSMAP``."""
    precompiled = {"type": "Precompiled", "precompiled_charsmap": CORRUPT_CHARSMAP}
    return {
        **tokenizer,
        "normalizer": {"type": "Sequence", "normalizers": [precompiled, tokenizer["normalizer"]]},
    }


def token_count_graph() -> ModelProto:
    """``input_ids`` and ``attention_mask`` int64 (batch, tokens) in; ``tokens`` int64 (batch,),
    each text's count of real tokens, out (``input_ids`` times zero added, so both are used)."""
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "token_axis"], ["tokens_only"], keepdims=0),
        helper.make_node("ReduceSum", ["input_ids", "token_axis"], ["id_total"], keepdims=0),
        helper.make_node("Mul", ["id_total", "zero"], ["nothing"]),
        helper.make_node("Add", ["tokens_only", "nothing"], ["tokens"]),
    ]
    graph = helper.make_graph(
        nodes,
        "token_count",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch"])],
        initializer=[
            numpy_helper.from_array(np.array([1], dtype=np.int64), "token_axis"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        ],
    )
    return model_of(graph)


def write_text_model(root: Path, name: str, tokenizer: dict[str, Any]) -> Path:
    """``root/name``: version 1 of ``token_count_graph`` behind ``tokenizer``; returns its
    tokenizer.json."""
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.onnx").write_bytes(token_count_graph().SerializeToString())
    (root / name / "config.yaml").write_text(TEXT_CONFIG, encoding="utf-8")
    path = version_dir / "tokenizer.json"
    path.write_text(json.dumps(tokenizer), encoding="utf-8")
    return path
