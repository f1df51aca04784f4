"""One servable model as the repository found it, before any backend loads it.

Its own module because both sides of loading name it: the repository builds it, and every
backend's ``load`` takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from udfserve.runtime.model_config import ModelConfig


@dataclass(frozen=True)
class ModelSource:
    """One servable version of a model: its folder and the model's validated config."""

    name: str
    version: int
    path: Path
    config: ModelConfig
    available_versions: tuple[int, ...]
    backend: str = ""
    """The backend that loads it: config.yaml's, else the one its files call for; "" when the
    files call for none or for several (loading it then fails, naming the files)."""
    fingerprint: str = ""
    """A digest of the version folder's files (names, sizes, modification times): a server
    watching the repository loads the version again when it changes."""
