"""Every backend, in one table: the one place a backend is registered.

An entry says what a backend's model files are called, which framework and pip extra it needs,
and where its code lives (a folder of ``udfserve.runtime.backends``). Everything else is derived
from the table: the file names the repository scan reads a version folder's backend from (``model_formats``),
the values config.yaml's ``backend`` takes (``model_config``), the class ``get_backend`` imports,
the extras ``udfserve doctor`` reports, and the example models ``udfserve models generate``
writes. Adding a backend is a folder under ``backends/`` and one entry here (docs/backends.md,
"Adding a backend").

This module imports nothing of a framework, nor of the backends' folders: the server, the scan
and the Spark client's fallback read it without loading any framework.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendFormat:
    """One backend: its model files, its framework, its extra and its code."""

    backend: str
    """The name config.yaml's ``backend`` gives."""
    files: tuple[str, ...]
    """File names (``*.keras`` a pattern) the backend loads from a version folder."""
    module: str
    """The framework's top-level module: present when the backend is installed."""
    extra: str
    """``pip install 'udfserve[<extra>]'`` installs it."""
    described: str
    """What a model of this backend is, in a message."""
    files_text: str
    """Its model files as messages list them."""
    label: str
    """The framework's name, as people write it."""
    loader: str
    """``module:Class`` of its ``Backend``: a folder of ``udfserve.runtime.backends``, imported only
    when asked for."""
    examples: str = ""
    """``module:function`` writing its example models into a repository (``udfserve models generate
    --backend-examples <name>``); "" when the backend brings none of its own."""


FORMATS = (
    BackendFormat(
        "tensorflow",
        # legacy HDF5 files too: the TensorFlow backend refuses them, saying how to convert them
        ("model.keras", "*.keras", "saved_model.pb", "*.h5", "*.hdf5"),
        "tensorflow",
        "tensorflow",
        "a Keras file or a SavedModel",
        "model.keras or a SavedModel",
        "TensorFlow",
        "udfserve.runtime.backends.tensorflow:TensorFlowBackend",
    ),
    BackendFormat(
        "onnxruntime",
        ("model.onnx",),
        "onnxruntime",
        "onnx",
        "an ONNX graph",
        "model.onnx",
        "ONNX Runtime",
        "udfserve.runtime.backends.onnxruntime:OnnxRuntimeBackend",
    ),
    BackendFormat(
        "pytorch",
        ("model.pt2", "model.pt"),
        "torch",
        "torch",
        "a torch.export program or TorchScript",
        "model.pt2 or model.pt",
        "PyTorch",
        "udfserve.runtime.backends.pytorch:PyTorchBackend",
    ),
    BackendFormat(
        "xgboost",
        ("model.ubj", "model.json"),
        "xgboost",
        "xgboost",
        "an XGBoost booster",
        "model.ubj or model.json",
        "XGBoost",
        "udfserve.runtime.backends.xgboost:XGBoostBackend",
        "udfserve.runtime.backends.xgboost.example:write_examples",
    ),
)
BACKEND_NAMES = tuple(format_.backend for format_ in FORMATS)
FORMAT_BY_BACKEND = {format_.backend: format_ for format_ in FORMATS}
MODEL_FILES_TEXT = ", ".join(f"{format_.files_text} ({format_.label})" for format_ in FORMATS)
"""Every backend's model files, for messages that say what a version folder may hold."""
