"""``warmup:`` in config.yaml: whether a version is called before it serves, and with what.

``warmup: true`` (the default) and ``warmup: false`` keep their meaning: a synthetic warm-up of
zeros (empty strings for string inputs), or none. The section form names sample inputs, as
Triton's ``model_warmup`` does, for a model whose inputs zeros do not fit (a string parsed as a
number, an integer used as an index)::

    warmup:
      samples:
        - {text: [["1.5"], ["-2"]]}        # one call: each input's rows, as nested lists

A sample is a mapping from each of the model's inputs to its rows; strings for string inputs,
numbers (or booleans) for the others. A version folder may carry its own samples in
``warmup.json`` (``warmup_file``), which replace config.yaml's for that version. The samples are
checked against the model's inputs at load (``backends.warmup_samples``), where a sample that
does not fit, or that the model refuses, fails the load: the user said the model takes it. What
happens when the synthetic warm-up fails is said in ``backends.warmup``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

MAX_SAMPLES = 16
"""The most samples of one model: each is a warm-up call at every load of every version."""
MAX_SAMPLE_ROWS = 4096
"""The most rows of one sample as written; the largest warm-up call repeats them up to the batch."""

Rows = list[Any]
"""One input's rows: a list whose items are the rows (a value, or nested lists of a row's shape)."""


class WarmupConfig(BaseModel):
    """``warmup:`` as a section; ``true`` is ``{}`` and ``false`` is ``{enabled: false}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description="call the model before it serves (false: never)")
    samples: tuple[dict[str, Rows], ...] = Field(
        default=(),
        max_length=MAX_SAMPLES,
        description="sample inputs, each one warm-up call: every input of the model and its rows; given, "
        "they replace the synthetic zeros and a failure of one fails the load",
    )

    @field_validator("samples")
    @classmethod
    def _rows_of_one_count(cls, value: tuple[dict[str, Rows], ...]) -> tuple[dict[str, Rows], ...]:
        for index, sample in enumerate(value):
            counts = {name: len(rows) for name, rows in sample.items()}
            if not counts or min(counts.values()) == 0:
                raise ValueError(
                    f"warm-up sample {index}: expected each of the model's inputs with at least one row; "
                    f"got {counts or 'no input'}"
                )
            if len(set(counts.values())) != 1 or max(counts.values()) > MAX_SAMPLE_ROWS:
                raise ValueError(
                    f"warm-up sample {index}: rows per input {counts}; expected the same number of rows "
                    f"for every input, at most {MAX_SAMPLE_ROWS}"
                )
        return value

    _samples_from: str = PrivateAttr(default="config.yaml")

    @property
    def samples_from(self) -> str:
        """The file the samples were written in, as messages name it: config.yaml, or a version
        folder's warm-up file from the repository down (``model/2/warmup.json``)."""
        return self._samples_from

    def with_samples_from(self, samples: tuple[dict[str, Rows], ...], file: str) -> WarmupConfig:
        """This config with ``samples`` (checked as config.yaml's are) read from ``file``."""
        config = WarmupConfig(enabled=self.enabled, samples=samples)
        config._samples_from = file
        return config


def warmup_of(value: object) -> object:
    """``warmup:`` as written: a boolean is the flag it always was, anything else the section."""
    if isinstance(value, bool):
        return WarmupConfig(enabled=value)
    return value
