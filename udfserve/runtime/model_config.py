"""``<repo>/<model>/config.yaml``, validated: which backend, version and batch limits a model has,
and the pre-processing step (if any) that turns its public input into the model's own.

The model server reads it to batch a model's requests, the CPU fallback to cut its batches; the
name rule also guards every path built from a model name.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from udfserve.runtime.backend_registry import FORMAT_BY_BACKEND, MODEL_FILES_TEXT
from udfserve.runtime.tensor_spec import TensorSpec, WholeNumber
from udfserve.runtime.warmup_config import WarmupConfig, warmup_of

MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_QUEUE_BATCHES = 64
"""Default queue bound, in full batches: room for the in-flight windows of several Spark tasks
(each holds up to 4 x 4,096 rows by default) without refusing them, yet bounded."""


def validate_model_name(name: str) -> str:
    """Refuse names that could address anything outside the model repository."""
    if not MODEL_NAME_PATTERN.match(name) or name in {".", ".."} or ".." in name:
        shown = repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} characters)"
        raise ValueError(
            f"invalid model name {shown}: expected 1-128 characters of [A-Za-z0-9_.-], "
            "not starting with '.' or '-', without '..' or path separators"
        )
    return name


class BatchingConfig(BaseModel):
    """How the dynamic batcher of one model merges requests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    max_queue_delay_s: float = Field(
        default=0.002,
        ge=0.0,
        le=10.0,
        description="how long a request queued behind a running batch may wait for company; a request "
        "that finds the batcher idle starts at once, unless the last batch merged several requests "
        "less than this delay ago: then the next batch waits, at most this long after that batch "
        "finished, for as many requests as it held (their clients coming back)",
    )
    max_queue_rows: WholeNumber | None = Field(
        default=None, gt=0, description="rows waiting before RESOURCE_EXHAUSTED; default 64 x max_batch_size"
    )


class VersionPolicy(BaseModel):
    """Which of a model's version folders are served, as Triton's ``version_policy``: exactly one
    of ``latest: N`` (the N highest), ``specific: [..]`` (those listed) or ``all: true``. A request
    that names no version gets the highest version served."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latest: WholeNumber | None = Field(default=None, ge=1, le=64, description="serve the N highest versions")
    specific: tuple[WholeNumber, ...] | None = Field(
        default=None, min_length=1, max_length=64, description="serve exactly these versions"
    )
    all: bool = Field(default=False, description="serve every version folder (at most 64)")

    @field_validator("specific")
    @classmethod
    def _positive_versions(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(version < 1 for version in value):
            raise ValueError(f"versions are positive integers, got {list(value)}")
        return None if value is None else tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionPolicy:
        chosen = [
            name
            for name, set_ in (
                ("latest", self.latest is not None),
                ("specific", self.specific is not None),
                ("all", self.all),
            )
            if set_
        ]
        if len(chosen) != 1:
            raise ValueError(
                f"a version policy names exactly one of latest, specific or all; got {chosen or 'none'}"
            )
        return self

    def served(self, available: tuple[int, ...]) -> tuple[int, ...]:
        """The versions of ``available`` (ascending) this policy serves, ascending."""
        if self.latest is not None:
            return available[-self.latest :]
        if self.specific is not None:
            return tuple(version for version in available if version in self.specific)
        return available[-MAX_SERVED_VERSIONS:]


MAX_SERVED_VERSIONS = 64
"""The most versions of one model a server holds at once: ``all`` serves the 64 highest."""

LATEST_ONE = VersionPolicy(latest=1)

TOKENIZER_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""What a tokenizer gives per text, each a model input of the same name: the token ids, 1 for a
real token and 0 for padding, and the segment of each token (all 0 for one text)."""
MAX_TOKENS = 8192
"""The longest ``max_length`` accepted: a bound on every batch's width whatever a client sends."""
CHARACTERS_PER_TOKEN = 32
"""Characters of a text read per token kept, by default: a token of a natural-language text
spans a few characters, so a text is cut well past its ``max_length``-th token."""


class TextPreprocess(BaseModel):
    """``preprocess:`` in config.yaml: the server tokenizes a string input before the model runs.

    The model's public input is then one string per row, named ``input``; each batch is encoded
    with the tokenizer of ``tokenizer`` (a Hugging Face ``tokenizer.json`` in the version folder,
    read with the ``tokenizers`` package), truncated to ``max_length`` tokens, padded with
    ``pad_token`` to the batch's longest text, and fed to the model's inputs named in ``outputs``.
    Executors send text and never load a tokenizer; the CPU fallback runs the same step.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokenizer: str = Field(
        default="tokenizer.json",
        description="the tokenizer file, a file name in each version folder (no folders)",
    )
    input: str = Field(default="text", min_length=1, max_length=128, description="the public string input")
    max_length: WholeNumber = Field(
        default=128,
        ge=1,
        le=MAX_TOKENS,
        description="tokens per text, special tokens included; longer texts are truncated",
    )
    max_characters: WholeNumber | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description=f"characters of a text tokenized, the rest cut first (default {CHARACTERS_PER_TOKEN} x "
        "max_length): tokenizing costs in proportion to the text, and what lies past max_length tokens "
        "is thrown away, so a client cannot make the server tokenize a megabyte to keep a few tokens",
    )
    pad_token: str = Field(default="[PAD]", min_length=1, description="the token that pads shorter texts")
    outputs: tuple[str, ...] = Field(
        default=("input_ids", "attention_mask"),
        min_length=1,
        description=f"the tokenizer's outputs fed to the model, each to the input of its name: some of "
        f"{', '.join(TOKENIZER_OUTPUTS)}; the model's inputs are exactly these",
    )

    @property
    def characters(self) -> int:
        """The characters of a text that are tokenized."""
        return self.max_characters or CHARACTERS_PER_TOKEN * self.max_length

    @field_validator("tokenizer")
    @classmethod
    def _file_name(cls, value: str) -> str:
        if not value or "/" in value or "\\" in value or value in {".", ".."} or value.startswith("."):
            raise ValueError(
                f"tokenizer {value!r}: expected the name of a file in the version folder, such as "
                "tokenizer.json (no folders, not hidden)"
            )
        return value

    @field_validator("outputs")
    @classmethod
    def _known_outputs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in TOKENIZER_OUTPUTS]
        if unknown or len(set(value)) != len(value):
            raise ValueError(
                f"outputs {list(value)}: expected distinct names among {', '.join(TOKENIZER_OUTPUTS)}"
                + (f"; unknown: {unknown}" if unknown else "")
            )
        return value


class ModelConfig(BaseModel):
    """``<repo>/<model>/config.yaml``. Every field is optional but the file must parse."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    backend: str | None = Field(
        default=None,
        description="the backend that loads the model (one of backend_registry's names); default read "
        f"from each version folder's file names ({MODEL_FILES_TEXT})",
    )
    version: WholeNumber | None = Field(
        default=None, ge=1, description="serve only this version (short for version_policy: {specific: [N]})"
    )
    version_policy: VersionPolicy | None = Field(
        default=None, description="which versions to serve; default the newest (latest: 1)"
    )
    max_batch_size: WholeNumber = Field(default=1024, ge=1, le=1 << 20)
    dynamic_batching: BatchingConfig = Field(default_factory=BatchingConfig)
    inputs: tuple[TensorSpec, ...] | None = Field(
        default=None,
        description="the model's inputs; default read from the model file. With preprocess, the "
        "inputs of the model file (the tokenizer's outputs), not the public string input",
    )
    outputs: tuple[TensorSpec, ...] | None = None
    warmup: WarmupConfig = Field(
        default_factory=WarmupConfig,
        description="true (synthetic warm-up), false (none), or a section naming sample inputs",
    )
    preprocess: TextPreprocess | None = Field(
        default=None, description="tokenize a string input on the server before the model runs"
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        return None if value is None else validate_model_name(value)

    @field_validator("warmup", mode="before")
    @classmethod
    def _warmup_flag(cls, value: object) -> object:
        return warmup_of(value)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is not None and value not in FORMAT_BY_BACKEND:
            known = ", ".join(map(repr, FORMAT_BY_BACKEND))
            raise ValueError(f"unknown backend {value!r}; expected one of {known}")
        return value

    @model_validator(mode="after")
    def _one_version_rule(self) -> ModelConfig:
        if self.version is not None and self.version_policy is not None:
            raise ValueError(
                "version and version_policy both choose the versions served; expected one of them "
                f"(version: {self.version} is version_policy: {{specific: [{self.version}]}})"
            )
        return self

    @model_validator(mode="after")
    def _preprocess_feeds_the_inputs(self) -> ModelConfig:
        if self.preprocess is None or self.inputs is None:
            return self
        declared = [spec.name for spec in self.inputs]
        wrong = [
            f"{spec.name} ({spec.dtype}, shape {list(spec.shape)})"
            for spec in self.inputs
            if not spec.dtype.startswith("int") or len(spec.shape) != 1
        ]
        if sorted(declared) != sorted(self.preprocess.outputs) or wrong:
            raise ValueError(
                f"with preprocess, inputs declares the model's own inputs, which the tokenizer feeds: "
                f"expected {list(self.preprocess.outputs)}, integer dtypes of per-row shape [-1]; got "
                f"{declared}" + (f", of which not so: {', '.join(wrong)}" if wrong else "")
            )
        return self

    @property
    def versions(self) -> VersionPolicy:
        """The version policy in force: ``version_policy``, ``version`` as a one-version policy, or
        the newest version."""
        if self.version_policy is not None:
            return self.version_policy
        if self.version is not None:
            return VersionPolicy(specific=(self.version,))
        return LATEST_ONE

    @property
    def max_queue_rows(self) -> int:
        return self.dynamic_batching.max_queue_rows or DEFAULT_QUEUE_BATCHES * self.max_batch_size
