"""``udfserve models import-hf``: a fine-tuned Hugging Face text classifier into the repository.

The folder is what ``save_pretrained`` of a sequence classifier and of its fast tokenizer write
(``config.json``, ``model.safetensors``, ``tokenizer.json``). The model is loaded with
transformers from that folder alone (no hub, no remote code, safetensors weights only: nothing is
unpickled), wrapped so that its graph ends in a softmax (its one output, ``probabilities``), and
exported with free batch and sequence dimensions:

- ``onnx`` (default): ``model.onnx`` through torch.onnx's TorchScript exporter, served by ONNX
  Runtime; the server and the executors' CPU fallback then need neither torch nor transformers.
- ``pt2``: ``model.pt2``, a ``torch.export`` program, served by the PyTorch backend.

The exported file is checked against transformers in-process, on batches of other sizes and
lengths than it was traced with, before anything is written. The new version folder gets the
model file and a copy of ``tokenizer.json``, and the model's ``config.yaml`` a ``preprocess``
step, so the server tokenizes each batch (``udfserve.runtime.preprocessing``). The version is
written to a hidden folder and renamed, so a server watching the repository never sees half of it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import yaml
from pydantic import ValidationError

from udfserve.runtime.model_config import MAX_TOKENS, TOKENIZER_OUTPUTS, ModelConfig, validate_model_name

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

ModelFormat = Literal["onnx", "pt2"]
MODEL_FILES: dict[str, str] = {"onnx": "model.onnx", "pt2": "model.pt2"}
OUTPUT_NAME = "probabilities"
TOKENIZER_FILE = "tokenizer.json"
IMPORT_EXTRA = "hf"
ONNX_OPSET = 17
AGREEMENT = 1e-5
"""The largest difference allowed between the exported file's probabilities and transformers'."""
MAX_DEFAULT_LENGTH = 512

SAMPLE_TEXTS = (
    "An example text to trace the model with.",
    "A second one, longer, so that the batch is padded: its tokens, and more of them, and a few more.",
    "Short.",
)
CHECK_TEXTS = (
    ("One text alone.",),
    (
        "Other texts than the traced ones,",
        "of other lengths, in a batch of four,",
        "",
        "check the free dimensions.",
    ),
)
"""Batches the exported file must answer as transformers does: other sizes and lengths than the
sample it was traced with, an empty text among them."""


class HfImportError(ValueError):
    """The folder cannot be imported; the message names the file and what was expected."""


@dataclass(frozen=True)
class ImportedModel:
    """What an import wrote."""

    version_dir: Path
    feeds: tuple[str, ...]
    labels: tuple[str, ...]
    max_length: int
    largest_difference: float | None
    """The largest difference from transformers on the sample texts; None when the runtime that
    would serve the file is not installed here to check it."""


def import_hugging_face(
    folder: Path,
    repository: Path,
    name: str,
    *,
    model_format: ModelFormat = "onnx",
    max_length: int | None = None,
    version: int | None = None,
    max_batch_size: int = 256,
) -> ImportedModel:
    """Export the classifier of ``folder`` as version ``version`` (default: one more than the
    highest present) of model ``name`` in ``repository``. ``HfImportError`` naming what is wrong."""
    validate_model_name(name)
    if model_format not in MODEL_FILES:
        raise HfImportError(f"format {model_format!r}: expected one of {', '.join(MODEL_FILES)}")
    if version is not None and version < 1:
        raise HfImportError(f"version {version}: expected a positive integer")
    folder = Path(folder)
    _check_folder(folder)
    torch, transformers = _frameworks()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, local_files_only=True, use_safetensors=True, trust_remote_code=False
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        folder, local_files_only=True, trust_remote_code=False
    )
    if tokenizer.pad_token is None:
        raise HfImportError(
            f"the tokenizer of {folder} has no pad token; expected one (tokenizer.pad_token): "
            "batches are padded"
        )
    length = max_length or _default_length(tokenizer, model)
    positions = int(getattr(model.config, "max_position_embeddings", MAX_TOKENS))
    if not 1 <= length <= min(positions, MAX_TOKENS):
        raise HfImportError(
            f"max_length {length}: expected 1 to {min(positions, MAX_TOKENS)} tokens (the model has "
            f"{positions} positions)"
        )
    # In the order of the wrapper's parameters: input_ids, attention_mask, then token_type_ids
    # when the tokenizer makes them, whatever order the tokenizer lists them in.
    feeds = tuple(name for name in TOKENIZER_OUTPUTS if name in tokenizer.model_input_names)
    if feeds[:2] != ("input_ids", "attention_mask"):
        raise HfImportError(
            f"the tokenizer of {folder} gives {tokenizer.model_input_names}; expected input_ids and "
            "attention_mask (the texts of a batch are padded: the model must be told which tokens are)"
        )
    labels = tuple(str(model.config.id2label[index]) for index in range(model.config.num_labels))
    config = _config(name, feeds, length, tokenizer.pad_token, max_batch_size)
    probabilities = _probabilities(model).eval()
    samples = tokenizer(
        list(SAMPLE_TEXTS), padding=True, truncation=True, max_length=length, return_tensors="pt"
    )
    example = tuple(samples[feed] for feed in feeds)

    model_dir = Path(repository) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    number = version or 1 + max((int(p.name) for p in model_dir.iterdir() if p.name.isdigit()), default=0)
    target = model_dir / str(number)
    if target.exists():
        raise FileExistsError(
            f"{target} exists: a version is never rewritten in place; expected a new version"
        )
    staging = Path(tempfile.mkdtemp(prefix=f".{number}.", dir=model_dir))
    try:
        model_file = staging / MODEL_FILES[model_format]
        checks = []
        with torch.inference_mode():
            for texts in CHECK_TEXTS:
                encoded = tokenizer(
                    list(texts), padding=True, truncation=True, max_length=length, return_tensors="pt"
                )
                inputs = tuple(encoded[feed] for feed in feeds)
                checks.append((inputs, probabilities(*inputs)[OUTPUT_NAME].numpy()))
        if model_format == "onnx":
            _export_onnx(torch, probabilities, example, feeds, model_file)
        else:
            _export_pt2(torch, probabilities, example, feeds, model_file, length)
        difference = _difference(model_format, model_file, feeds, checks)
        if difference is not None and difference > AGREEMENT:
            raise HfImportError(
                f"the exported {model_file.name} differs from transformers by {difference:.2e} on "
                "sample texts; "
                f"expected at most {AGREEMENT:g}"
            )
        shutil.copyfile(folder / TOKENIZER_FILE, staging / TOKENIZER_FILE)
        _write_config(model_dir, config, labels)
        staging.chmod(0o755)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info(
        "imported %s as %s (%s, inputs %s, at most %d tokens a text, labels %s)",
        folder,
        target,
        MODEL_FILES[model_format],
        ", ".join(feeds),
        length,
        ", ".join(labels),
    )
    return ImportedModel(target, feeds, labels, length, difference)


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise HfImportError(
            f"{folder} is not a folder; expected a fine-tuned model's folder (save_pretrained)"
        )
    present = sorted(entry.name for entry in folder.iterdir())
    missing = [file for file in ("config.json", TOKENIZER_FILE) if file not in present]
    if not any(file.endswith(".safetensors") or file == "model.safetensors.index.json" for file in present):
        pickled = [file for file in present if file.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        missing.append(
            "model.safetensors"
            + (
                f" ({', '.join(pickled)} are pickle files, which are never loaded: save the model with "
                "save_pretrained(folder, safe_serialization=True) where it is trusted)"
                if pickled
                else ""
            )
        )
    if missing:
        raise HfImportError(
            f"{folder} lacks {', '.join(missing)}; expected a folder written by save_pretrained of a "
            f"sequence classifier and of its fast tokenizer; found {present}"
        )


def _frameworks() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise HfImportError(
            f"import-hf needs torch and transformers ({exc.name} is not installed); expected "
            f"`pip install 'udfserve[{IMPORT_EXTRA}]'` on the machine that imports (not on servers or "
            "executors)"
        ) from exc
    transformers.utils.logging.disable_progress_bar()  # bars of a one-file load, in a command's log
    return torch, transformers


def _default_length(tokenizer: Any, model: Any) -> int:
    limits = [MAX_DEFAULT_LENGTH, int(getattr(model.config, "max_position_embeddings", MAX_DEFAULT_LENGTH))]
    if 0 < int(tokenizer.model_max_length) < 1 << 30:  # transformers' "no limit" is a huge number
        limits.append(int(tokenizer.model_max_length))
    return min(limits)


def _probabilities_module() -> type:
    import torch

    class Probabilities(torch.nn.Module):
        """The classifier's logits through a softmax. The parameters are named, in this order, so
        that the exported graph's inputs are named after the tokenizer's outputs; the answer is a
        dict so that a torch.export program names its output too (ONNX names it on export)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor | None = None,
        ) -> dict[str, torch.Tensor]:
            logits = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits
            return {OUTPUT_NAME: torch.softmax(logits.float(), dim=-1)}

    return Probabilities


def _probabilities(model: Any) -> Any:
    """The classifier behind a softmax (the module class is made here: torch is imported late)."""
    return _probabilities_module()(model)


def _export_onnx(
    torch: Any, module: Any, example: tuple[Any, ...], feeds: tuple[str, ...], path: Path
) -> None:
    dynamic = {feed: {0: "batch", 1: "sequence"} for feed in feeds}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=list(feeds),
            output_names=[OUTPUT_NAME],
            dynamic_axes={**dynamic, OUTPUT_NAME: {0: "batch"}},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def _export_pt2(
    torch: Any, module: Any, example: tuple[Any, ...], feeds: tuple[str, ...], path: Path, length: int
) -> None:
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    sequence = torch.export.Dim("sequence", min=1, max=length)
    dynamic = {feed: {0: batch, 1: sequence} for feed in feeds}
    program = torch.export.export(module, example, dynamic_shapes=dynamic)
    torch.export.save(program, str(path))


def _difference(
    model_format: str, path: Path, feeds: tuple[str, ...], checks: list[tuple[tuple[Any, ...], np.ndarray]]
) -> float | None:
    """The largest difference between the exported file's answers to each check's inputs and the
    answers transformers gave; None when the runtime that serves the file is not installed here."""
    if model_format == "onnx":
        try:
            import onnxruntime
        except ImportError:
            logger.warning(
                "onnxruntime is not installed here: %s is not checked against transformers", path.name
            )
            return None
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def answer(inputs: tuple[Any, ...]) -> np.ndarray:
            arrays = {feed: tensor.numpy() for feed, tensor in zip(feeds, inputs, strict=True)}
            return np.asarray(session.run([OUTPUT_NAME], arrays)[0])
    else:
        import torch

        program = torch.export.load(str(path)).module()

        def answer(inputs: tuple[Any, ...]) -> np.ndarray:
            with torch.inference_mode():
                return np.asarray(program(*inputs)[OUTPUT_NAME].numpy())

    return max(float(np.abs(answer(inputs) - expected).max()) for inputs, expected in checks)


def _config(
    name: str, feeds: tuple[str, ...], max_length: int, pad_token: str, max_batch_size: int
) -> dict[str, Any]:
    """The model's config.yaml, checked as the server will read it (before anything is exported)."""
    config = {
        "name": name,
        "max_batch_size": max_batch_size,
        "preprocess": {
            "tokenizer": TOKENIZER_FILE,
            "input": "text",
            "max_length": max_length,
            "pad_token": pad_token,
            "outputs": list(feeds),
        },
    }
    try:
        ModelConfig.model_validate(config)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors())
        raise HfImportError(f"the model's config.yaml would be invalid: {problems}") from None
    return config


def _write_config(model_dir: Path, config: dict[str, Any], labels: tuple[str, ...]) -> None:
    header = (
        f"# A Hugging Face text classifier: one string per row in (text), {OUTPUT_NAME} of the labels "
        f"{', '.join(labels)} out.\n"
    )
    (model_dir / "config.yaml").write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
