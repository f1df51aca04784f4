"""The example text classifier: a small BERT-like model, made here as a user's fine-tuned one is.

No weights can be downloaded, so the model is built from a ``transformers`` config with seeded
random weights, and its WordPiece tokenizer is trained with the ``tokenizers`` package on
generated review-like sentences. Both are saved as a fine-tuned model folder is
(``config.json``, ``model.safetensors``, ``tokenizer.json``), and that folder goes through
``udfserve models import-hf`` (``udfserve.services.hf_import``), the code path a user's own model takes:
the example proves the import, not a shortcut around it. Its answers are random-weight answers;
what matters is that the server, the CPU fallback and transformers in-process give the same ones.

Needs torch and transformers (``udfserve models generate --text-classifier``); the tokenizer
alone (``train_tokenizer``) needs only tokenizers.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

NAME = "text_classifier"
SEED = 5
LABELS = ("negative", "neutral", "positive")
MAX_LENGTH = 64
"""Tokens per text the example serves; a longer text is truncated."""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCABULARY_SIZE = 600

_SUBJECTS = ("the movie", "this film", "the plot", "the acting", "the ending", "the soundtrack", "her role")
_VERBS = ("was", "is", "felt", "seemed", "looked", "sounded")
_ADVERBS = ("very", "quite", "really", "not", "barely", "truly", "so", "rather")
_ADJECTIVES = (
    "good",
    "great",
    "wonderful",
    "touching",
    "bad",
    "awful",
    "boring",
    "dull",
    "fine",
    "average",
    "long",
    "surprising",
    "délicieux",
    "schön",
)
_TAILS = ("", "!", ".", " overall.", " to me.", " and i left early.", " — worth it?", " 10/10")


def generated_text(rng: random.Random) -> str:
    """One review-like sentence of one to three clauses."""
    clauses = [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_ADVERBS)} {rng.choice(_ADJECTIVES)}"
        for _ in range(rng.randint(1, 3))
    ]
    return ", ".join(clauses).capitalize() + rng.choice(_TAILS)


def generated_texts(count: int, seed: int = SEED) -> list[str]:
    """``count`` sentences, the same for the same seed."""
    rng = random.Random(seed)
    return [generated_text(rng) for _ in range(count)]


def train_tokenizer(texts: Iterable[str], vocabulary_size: int = VOCABULARY_SIZE) -> Tokenizer:
    """A BERT-style WordPiece tokenizer trained on ``texts``: lower-cased, accents kept,
    ``[CLS] text [SEP]`` around each text, ``[PAD]`` to pad."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocabulary_size, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer


def write_fine_tuned_folder(folder: Path, seed: int = SEED) -> Path:
    """A model folder as ``save_pretrained`` of a fine-tuned classifier and its fast tokenizer
    writes it: config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the bars of saving one small file, in a command's log

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(generated_texts(5_000, seed)),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_LENGTH,
    )
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=len(LABELS),  # type: ignore[call-arg]  # PretrainedConfig takes it, BertConfig passes it on
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def generate_text_classifier(
    root: Path, *, overwrite: bool = False, model_format: Literal["onnx", "pt2"] = "onnx"
) -> Path:
    """``root/text_classifier``: a fine-tuned folder written to a temporary place, then imported
    with ``import_hugging_face`` as a user's model is. Kept when present unless ``overwrite``."""
    from udfserve.services.hf_import import import_hugging_face

    target = root / NAME
    if target.exists() and not overwrite:
        logger.info("keeping %s: already present (pass --overwrite to regenerate it)", target)
        return target
    with tempfile.TemporaryDirectory(prefix="udfserve-hf-") as scratch:
        folder = write_fine_tuned_folder(Path(scratch) / "fine_tuned")
        if target.exists():
            shutil.rmtree(target)
        import_hugging_face(folder, root, NAME, model_format=model_format, max_length=MAX_LENGTH)
    return target
