"""Tokenization on the server: a model whose config.yaml declares ``preprocess`` takes text.

A text classifier's own inputs are token ids and an attention mask, which only its tokenizer can
make. Doing that in the Spark executors would load a tokenizer (and often transformers and torch)
into every Python worker; here it runs where the model runs. ``TokenizingModel`` wraps any
``LoadedModel`` (ONNX Runtime, PyTorch, TensorFlow alike): its public input is one string per
row, and each batch is encoded with the Hugging Face ``tokenizers`` package (Rust, its own
threads, no torch, no transformers) into the model's inputs, then run. The CPU fallback loads
models through ``repository.load_model`` too, so it tokenizes the same way.

The batch is padded to its longest text (at most ``max_length`` tokens), so short texts cost
short calls; every text of a batch is truncated to ``max_length`` tokens, its special tokens
included, after being cut to ``max_characters`` characters (tokenizing costs in proportion to the
text: the cut bounds what one row costs, whatever a client sends). A value that is not UTF-8 is
refused naming its row; nulls never reach the model (the tensor conversion refuses them, naming
the column and row).

The ``tokenizers`` library raises a panic of its Rust code as ``PanicException``, which is not an
``Exception``: a tokenizer file it cannot build (a corrupt ``precompiled_charsmap``) fails the load
naming the file, and a text it cannot encode (a normalizer regex over its backtracking limit)
fails that batch with ``ModelAborted`` (FAILED_PRECONDITION) naming the model and the tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from udfserve.log_text import error_line
from udfserve.runtime.backends.base import LoadedModel
from udfserve.runtime.errors import (
    BackendNotInstalled,
    InvalidInput,
    ModelAborted,
    ModelLoadError,
    raise_if_stopping,
)
from udfserve.runtime.model_config import TextPreprocess
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import FREE_DIM, STRING_DTYPE, TensorSpec

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

logger = logging.getLogger(__name__)

TEXT_EXTRA = "text"
"""``pip install 'udfserve[text]'`` installs the tokenizers package."""

_ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
"""Each tokenizer output by the attribute of a ``tokenizers.Encoding`` that holds it."""


class BatchTokenizer:
    """Texts in, the model's integer inputs out: ``(rows, tokens)`` arrays of the model's dtypes,
    padded to the batch's longest text (or to the model's fixed length) with ``pad_token``.

    Safe to call from several threads: the tokenizer is configured once, when it is opened, and
    only read by its calls (which release the GIL while they encode, in the package's own threads).
    """

    def __init__(
        self, tokenizer: Tokenizer, step: TextPreprocess, feeds: Sequence[TensorSpec], width: int | None
    ) -> None:
        self.step = step
        self._tokenizer = tokenizer
        self._width = width
        """The model's fixed sequence length, when it has one: every batch is padded to it."""
        self._feeds = tuple((spec.name, _ENCODING_FIELDS[spec.name], np.dtype(spec.dtype)) for spec in feeds)

    def __call__(self, texts: np.ndarray, model: str = "") -> dict[str, np.ndarray]:
        """The model's inputs for ``texts``, an object array of UTF-8 ``bytes`` (or of ``str``);
        ``InvalidInput`` naming the first row that is not UTF-8."""
        decoded = _decoded(model, self.step.input, texts, self.step.characters)
        try:
            encodings: list[Encoding] = self._tokenizer.encode_batch_fast(decoded)
        except Exception:
            raise
        except BaseException as panic:  # the Rust side panicked (PanicException): not an Exception
            raise_if_stopping(panic)
            raise ModelAborted(
                f"model {model!r}: its tokenizer {self.step.tokenizer} panicked on this batch: "
                f"{error_line(panic)}; the tokenizer file cannot encode this text (nor would it on any "
                "server): fix the tokenizer file, or leave the text out"
            ) from panic
        width = len(encodings[0].ids) if encodings else (self._width or 1)
        return {
            name: np.array([getattr(encoding, field) for encoding in encodings], dtype=dtype).reshape(
                len(encodings), width
            )
            for name, field, dtype in self._feeds
        }


class TokenizingModel:
    """``model`` behind a ``BatchTokenizer``: one string input in, the model's outputs out."""

    def __init__(self, model: LoadedModel, tokenize: BatchTokenizer) -> None:
        self.name = model.name
        self.version = model.version
        self.platform = model.platform
        self.inputs: tuple[TensorSpec, ...] = (
            TensorSpec(name=tokenize.step.input, dtype=STRING_DTYPE, shape=()),
        )
        self.outputs = model.outputs
        self.model = model
        self.tokenize = tokenize

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        column = self.tokenize.step.input
        if column not in inputs:
            raise InvalidInput(
                f"model {self.name!r}: missing input {column!r}; expected one string column named "
                f"{column!r}, received {sorted(inputs)}"
            )
        return self.model.predict(self.tokenize(inputs[column], self.name))

    def __repr__(self) -> str:
        return f"TokenizingModel({self.model!r}, tokenizer={self.tokenize.step.tokenizer!r})"


def with_preprocessing(model: LoadedModel, source: ModelSource) -> LoadedModel:
    """``model`` as its config's ``preprocess`` step declares it, or ``model`` itself when there
    is none; ``ModelLoadError`` naming the file when the tokenizer cannot be read or does not
    fit the model's inputs (``BackendNotInstalled`` when the tokenizers package is missing)."""
    step = source.config.preprocess
    if step is None:
        return model
    where = f"model {source.name!r} version {source.version}"
    tokenize = open_tokenizer(source.path / step.tokenizer, step, model.inputs, where)
    logger.info(
        "model %s version %d tokenizes its input %r with %s (at most %d tokens a text)",
        source.name,
        source.version,
        step.input,
        step.tokenizer,
        step.max_length,
    )
    return TokenizingModel(model, tokenize)


def open_tokenizer(
    path: Path, step: TextPreprocess, model_inputs: Sequence[TensorSpec], where: str
) -> BatchTokenizer:
    """The tokenizer file ``path`` set up as ``step`` says, to feed ``model_inputs``: truncating to
    ``step.max_length`` tokens, padding to a batch's longest text (to the model's length when it
    is fixed). ``ModelLoadError`` naming the file (or the inputs) at fault."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise BackendNotInstalled(
            f"{where}: its preprocess step needs the tokenizers package, which is not installed here; "
            f"expected `pip install 'udfserve[{TEXT_EXTRA}]'`"
        ) from exc
    width = _checked_inputs(model_inputs, step, where)
    if not path.is_file():
        found = sorted(entry.name for entry in path.parent.iterdir()) if path.parent.is_dir() else []
        raise ModelLoadError(
            f"{where}: no tokenizer file {path} (config.yaml's preprocess.tokenizer); found {found}"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except BaseException as exc:  # the Rust side's own exception type, or its panic (PanicException)
        raise_if_stopping(exc)
        problem = (
            str(exc) if isinstance(exc, Exception) else f"the tokenizers library panicked: {error_line(exc)}"
        )
        raise ModelLoadError(
            f"{where}: cannot read the tokenizer {path}: {problem}; expected a Hugging Face tokenizer.json "
            "(a fast tokenizer's save_pretrained, or tokenizers.Tokenizer.save)"
        ) from exc
    pad_id = tokenizer.token_to_id(step.pad_token)
    if pad_id is None:
        raise ModelLoadError(
            f"{where}: the tokenizer {path} has no token {step.pad_token!r} (preprocess.pad_token); expected "
            "the token its model pads with, such as [PAD] or <pad>"
        )
    direction = (tokenizer.padding or {}).get("direction", "right")
    tokenizer.enable_truncation(step.max_length)
    tokenizer.enable_padding(direction=direction, pad_id=pad_id, pad_token=step.pad_token, length=width)
    return BatchTokenizer(tokenizer, step, model_inputs, width)


def _checked_inputs(inputs: Sequence[TensorSpec], step: TextPreprocess, where: str) -> int | None:
    """The model's fixed sequence length (None when free), after checking that its inputs are
    exactly the tokenizer outputs the step feeds, as integer tensors of one dimension per row."""
    names = [spec.name for spec in inputs]
    wrong = [
        f"{spec.name} ({spec.dtype}, per-row shape {list(spec.shape)})"
        for spec in inputs
        if not spec.dtype.startswith(("int", "uint")) or len(spec.shape) != 1
    ]
    if sorted(names) != sorted(step.outputs) or wrong:
        raise ModelLoadError(
            f"{where}: its preprocess step feeds {list(step.outputs)} (integer, one token per position), "
            f"but the model's inputs are {names}"
            + (f"; not integer sequences: {', '.join(wrong)}" if wrong else "")
        )
    lengths = {spec.shape[0] for spec in inputs} - {FREE_DIM}
    if len(lengths) > 1:
        raise ModelLoadError(f"{where}: the model's inputs have different sequence lengths {sorted(lengths)}")
    if not lengths:
        return None
    (width,) = lengths
    if step.max_length > width:
        raise ModelLoadError(
            f"{where}: preprocess.max_length is {step.max_length} but the model takes {width} tokens a text; "
            f"expected max_length <= {width}"
        )
    return width


def _decoded(model: str, column: str, texts: np.ndarray, characters: int) -> list[str]:
    """``texts`` as ``str`` of at most ``characters`` characters: UTF-8 ``bytes`` decoded, refused
    naming the first row that is not."""
    decoded = []
    for row, value in enumerate(texts.tolist()):
        if not isinstance(value, bytes):
            decoded.append(str(value)[:characters])
            continue
        try:
            decoded.append(value.decode("utf-8")[:characters])
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"model {model!r}: input {column!r} row {row} is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); expected a string column, or binary holding UTF-8"
            ) from None
    return decoded
