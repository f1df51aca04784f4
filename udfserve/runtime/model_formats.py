"""Which backend a version folder's files call for (the file names of ``backend_registry``).

A repository may hold nothing but a model file: ``<model>/1/model.onnx`` is served by ONNX
Runtime, ``model.pt2`` or ``model.pt`` by PyTorch, ``model.keras`` or a SavedModel by
TensorFlow. The scan reads the backend from the file names (never from the files' contents, and
without importing a framework) unless ``config.yaml`` names one; a folder holding the files of
two backends is refused rather than guessed.
"""

from __future__ import annotations

from pathlib import Path

from udfserve.runtime.backend_registry import FORMAT_BY_BACKEND, FORMATS, MODEL_FILES_TEXT

__all__ = ["FORMAT_BY_BACKEND", "MODEL_FILES_TEXT", "SAVED_MODEL_FILE", "backends_present", "detect_backend"]

SAVED_MODEL_FILE = "saved_model.pb"
"""A TensorFlow SavedModel's graph: the file ``--no-trust-savedmodels`` refuses (``repository``)."""


def backends_present(version_dir: Path) -> dict[str, list[str]]:
    """The backends whose model files ``version_dir`` holds, each with the files found."""
    found: dict[str, list[str]] = {}
    for format_ in FORMATS:
        names = sorted({path.name for pattern in format_.files for path in version_dir.glob(pattern)})
        if names:
            found[format_.backend] = names
    return found


def detect_backend(version_dir: Path) -> str:
    """The backend ``version_dir``'s files call for; ``ValueError`` naming the folder when it
    holds no model file, or the files of more than one backend."""
    found = backends_present(version_dir)
    if len(found) == 1:
        return next(iter(found))
    if not found:
        present = sorted(path.name for path in version_dir.iterdir()) if version_dir.is_dir() else []
        raise ValueError(f"no model file in {version_dir}: expected {MODEL_FILES_TEXT}; found {present}")
    listed = "; ".join(f"{backend}: {', '.join(names)}" for backend, names in found.items())
    raise ValueError(
        f"{version_dir} holds the files of several backends ({listed}); expected the files of one, "
        f"or config.yaml naming the backend (backend: {'|'.join(FORMAT_BY_BACKEND)})"
    )
