"""In-process CPU inference for the batches no server answered.

The model runtime (``udfserve.runtime``) and TensorFlow are imported here only, and only when a
batch needs them: an executor whose server answers never loads a model. The GPUs are hidden
before TensorFlow is imported, so a fallback never competes with the node's model servers for
GPU memory. The model is read from the same repository the servers load and run through the same
runtime the servers run: the same backend and the same Arrow conversions
(``udfserve.runtime.tensor_conversion``), so the fallback computes what a server computes; it is
loaded once per Python worker process and kept for the tasks that follow.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from udfserve.spark_client.common.errors import ModelNotFound, ServerUnavailable
from udfserve.spark_client.common.model_spec import ModelSpec, spec_from_tensors

if TYPE_CHECKING:
    from udfserve.runtime.model_source import ModelSource

logger = logging.getLogger(__name__)

_models: dict[tuple[str, str, int, bool], tuple[Any, int]] = {}
_models_lock = threading.Lock()


def hide_gpus() -> None:
    """Make CUDA invisible to TensorFlow before it is imported; too late once it is, which is logged."""
    if "tensorflow" in sys.modules:
        logger.warning(
            "tensorflow is already imported in this Python worker; the CPU fallback cannot hide the GPUs "
            "from it and runs on whatever devices it already sees"
        )
        return
    from udfserve.runtime.device import pin_device

    pin_device("cpu")


def load_cpu_model(repository: Path, model: str, version: int = 0, pinned: bool = False) -> tuple[Any, int]:
    """The model loaded on the CPU and its ``max_batch_size``, once per worker process.

    The version is the one a server of ``repository`` serves (``model_source``): for ``version``
    0 the one a request naming no version gets, by the model's version policy; a pinned version
    only when the policy serves it. It is chosen when the worker first loads the model and kept for
    the tasks that follow; ``loaded.version`` says which it is. A version the job ``pinned`` is
    computed as long as its folder is in the repository, also once the policy serves a newer one.
    """
    key = (str(repository), model, version, pinned)
    with _models_lock:
        cached = _models.get(key)
        if cached is not None:
            return cached
        from udfserve.runtime.errors import ModelLoadError
        from udfserve.runtime.repository import load_model

        source = served_source(repository, model, version, pinned)
        hide_gpus()
        try:
            loaded = load_model(source)
        except ModelLoadError as exc:
            raise ServerUnavailable(f"CPU fallback cannot load model {model!r}: {exc}") from exc
        logger.info("CPU fallback loaded model %s version %d from %s", model, source.version, repository)
        _models[key] = (loaded, source.config.max_batch_size)
        return _models[key]


def served_source(repository: Path, model: str, version: int = 0, pinned: bool = False) -> ModelSource:
    """The ``ModelSource`` a server of ``repository`` would serve for ``version`` (0: a request
    naming none), or, for a version the job ``pinned``, the one its folder holds (a server keeps it
    leased while the job runs). ``ModelNotFound`` for a model or a version a server would not serve;
    ``ServerUnavailable`` for a model folder that cannot be served at all (the message says why)."""
    from udfserve.runtime.errors import ModelLoadError
    from udfserve.runtime.repository import model_source

    try:
        default = model_source(repository, model)
    except OSError as exc:
        raise ServerUnavailable(f"CPU fallback for model {model!r}: {exc}") from exc
    except ModelLoadError as exc:
        if not (repository / model).is_dir():
            raise ModelNotFound(f"model {model!r} does not exist: {exc}") from None
        raise ServerUnavailable(f"CPU fallback cannot load model {model!r}: {exc}") from None
    if not version or version == default.version:
        return default
    try:
        return model_source(repository, model, version, any_present=pinned)
    except ModelLoadError as exc:
        raise ModelNotFound(
            f"{exc}; a server answers NOT_FOUND for it and the CPU fallback does not compute it either: "
            f"expected ClientConfig.model_version to name a version the policy serves, or 0 for the "
            f"version a request naming none gets (here {default.version})"
        ) from None


def cpu_model_spec(repository: Path, model: str, version: int = 0) -> ModelSpec:
    """The model's inputs and outputs as the loaded model declares them."""
    loaded, _ = load_cpu_model(repository, model, version)
    return spec_from_tensors(
        loaded.name,
        loaded.version,
        [(t.name, t.dtype, t.shape) for t in loaded.inputs],
        [(t.name, t.dtype, t.shape) for t in loaded.outputs],
    )


def predict_on_cpu(
    repository: Path, model: str, version: int, batch: pa.RecordBatch, pinned: bool = False
) -> tuple[pa.RecordBatch, int]:
    """Answer one request batch as a server would: checked whole (so an error names the row as
    the server's would), run in chunks of the model's ``max_batch_size``; with the version that
    computed it."""
    from udfserve.runtime.errors import InvalidInput
    from udfserve.runtime.tensor_conversion import batch_to_inputs, outputs_to_batch
    from udfserve.spark_client.common.errors import RequestRejected

    loaded, max_batch_size = load_cpu_model(repository, model, version, pinned)
    try:
        inputs = batch_to_inputs(batch, loaded.name, loaded.inputs)
    except InvalidInput as exc:
        raise RequestRejected(
            f"CPU fallback refused a batch of {batch.num_rows} rows: {exc.message}", "INVALID_ARGUMENT"
        ) from None
    pieces = []
    for start in range(0, batch.num_rows, max_batch_size):
        chunk = {name: array[start : start + max_batch_size] for name, array in inputs.items()}
        pieces.append(outputs_to_batch(loaded.predict(chunk), loaded.outputs))
    answer = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)
    return answer, int(loaded.version)
