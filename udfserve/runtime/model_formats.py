"""Which backend a version folder's files call for, and which extra installs that backend.

A repository may hold nothing but a model file: ``<model>/1/model.onnx`` is served by ONNX
Runtime, ``model.pt2`` or ``model.pt`` by PyTorch, ``model.keras`` or a SavedModel by
TensorFlow. The scan reads the backend from the file names (never from the files' contents, and
without importing a framework) unless ``config.yaml`` names one; a folder holding the files of
two backends is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SAVED_MODEL_FILE = "saved_model.pb"


@dataclass(frozen=True)
class BackendFormat:
    """A backend's model files and the pip extra that installs its framework."""

    backend: str
    files: tuple[str, ...]
    """File names (``*.keras`` a pattern) the backend loads from a version folder."""
    module: str
    """The framework's top-level module: present when the backend is installed."""
    extra: str
    """``pip install 'udfserve[<extra>]'`` installs it."""
    described: str


FORMATS = (
    BackendFormat(
        "tensorflow",
        # legacy HDF5 files too: the TensorFlow backend refuses them, saying how to convert them
        ("model.keras", "*.keras", SAVED_MODEL_FILE, "*.h5", "*.hdf5"),
        "tensorflow",
        "server",
        "a Keras file or a SavedModel",
    ),
    BackendFormat("onnxruntime", ("model.onnx",), "onnxruntime", "onnx", "an ONNX graph"),
    BackendFormat(
        "pytorch", ("model.pt2", "model.pt"), "torch", "torch", "a torch.export program or TorchScript"
    ),
)
BACKEND_NAMES = tuple(format_.backend for format_ in FORMATS)
FORMAT_BY_BACKEND = {format_.backend: format_ for format_ in FORMATS}

MODEL_FILES_TEXT = (
    "model.keras or a SavedModel (TensorFlow), model.onnx (ONNX Runtime), model.pt2 or model.pt (PyTorch)"
)


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
        "or config.yaml naming the backend (backend: tensorflow|onnxruntime|pytorch)"
    )
