"""TensorFlow backend: a Keras 3 ``.keras`` file or a SavedModel, served through one ``tf.function``.

The model is wrapped in a ``tf.function`` with a fixed input signature (batch dimension free),
traced and warmed up at load: a call is then 2-20x cheaper than ``model.predict`` or ``model(x)``,
the first request pays no tracing, and calls from several worker threads are safe. Inputs and
outputs are read from the model's signature unless config.yaml declares them, in which case the
two must agree. Declared dtypes that differ from the model's are cast inside the graph; strings
(``tf.string``, fed as object arrays of ``bytes``) and numbers never convert into each other.
TensorFlow's own errors become the runtime's (``errors``): resource-exhausted is
``DeviceOutOfMemory``, so the batcher can split the batch in halves without knowing the framework;
invalid-argument (values the graph refuses) is ``InvalidInput``, told without TensorFlow's trace.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from udfserve.runtime.backends.base import BackendModel
from udfserve.runtime.backends.spec_agreement import SpecMismatch, agreed_specs
from udfserve.runtime.backends.tensorflow.calls import graph_caller, to_numpy, to_tensor
from udfserve.runtime.backends.tensorflow.errors import call_error
from udfserve.runtime.backends.tensorflow.framework import enable_memory_growth
from udfserve.runtime.backends.tensorflow.keras_ranges import embedding_ranges, with_ranges
from udfserve.runtime.backends.warmup import warm_up
from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import SUPPORTED_DTYPES, TensorSpec, zeros

logger = logging.getLogger(__name__)

PLATFORM = "tensorflow"
KERAS_FILE_NAME = "model.keras"
SAVED_MODEL_FILE_NAME = "saved_model.pb"
SERVING_SIGNATURE = "serving_default"
LEGACY_SUFFIXES = (".h5", ".hdf5")

_gpu_count: int | None = None


THREAD_ENV_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
"""TensorFlow's own settings of its CPU thread pools; when either is set, it decides."""


def _set_up_devices() -> None:
    """Memory growth on every visible GPU and the CPU thread pools, once per process."""
    global _gpu_count
    if _gpu_count is None:
        _set_up_threads()
        _gpu_count = enable_memory_growth()  # the device line is logged by the import


def _set_up_threads() -> None:
    """TensorFlow's CPU thread pools: intra-op one core short of the process's, inter-op one per core.

    The event loop answering gRPC runs in Python, one core's worth, and every request passes
    through it; an intra-op pool of one thread per core makes TensorFlow compete with that thread
    for the last core, and small batches gain nothing from splitting an op. Large calls use the
    cores by rows instead (``udfserve.services.model_server.core.cpu_parallel``): their parts run as
    concurrent calls, which the inter-op pool must be able to run at once. Measured: docs/benchmarks.md,
    section 6, "Thread pools". ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` in the
    environment win.
    """
    if any(os.environ.get(name) for name in THREAD_ENV_VARS):
        return
    cores = len(os.sched_getaffinity(0))
    intra, inter = max(1, cores - 1), cores
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as exc:  # TensorFlow already ran something in this process: too late
        logger.info("tensorflow thread pools left as they were: %s", exc)
        return
    logger.info("tensorflow thread pools: %d intra-op, %d inter-op thread(s)", intra, inter)


@dataclass(frozen=True)
class _Signature:
    """What a loaded artifact offers: its specs and a callable taking and returning name->tensor."""

    artifact: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    call: Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]]
    keepalive: Any = field(default=None, repr=False)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The values the model takes per integer input, where it implies them (``keras_ranges``)."""


class TensorFlowModel(BackendModel):
    """A loaded model. ``predict`` is blocking and safe to call from several threads."""

    platform = PLATFORM

    def __init__(
        self,
        *,
        name: str,
        version: int,
        artifact: Path,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        serve: tf.types.experimental.PolymorphicFunction,
        keepalive: Any,
    ) -> None:
        super().__init__(name=name, version=version, artifact=artifact, inputs=inputs, outputs=outputs)
        # The traced graph itself: calling it skips the polymorphic function's dispatch (matching
        # the arguments to a trace), 130-180 us of Python per call, which at a few rows per
        # batch is a third of the call.
        self._serve = serve.get_concrete_function()
        self._call = graph_caller(self._serve)
        self._input_dtypes = tuple(tf.as_dtype(spec.dtype) for spec in inputs)
        # A SavedModel's signature only holds weak references to the variables of the object
        # tf.saved_model.load returned; the model must outlive every call.
        self._keepalive = keepalive

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.require_inputs(inputs)
        try:
            results = self._call(
                [
                    to_tensor(inputs[spec.name], dtype)
                    for spec, dtype in zip(self.inputs, self._input_dtypes, strict=True)
                ]
            )
        except tf.errors.OpError as exc:
            raise call_error(self.name, self.rows(inputs), exc) from exc
        return {spec.name: to_numpy(results[spec.name]) for spec in self.outputs}


class TensorFlowBackend:
    """Loads ``<version>/model.keras`` (or the one ``*.keras`` file) or a SavedModel folder."""

    platform = PLATFORM

    def __init__(self) -> None:
        _set_up_devices()

    def load(self, source: ModelSource) -> TensorFlowModel:
        where = f"model {source.name!r} version {source.version}"
        artifact = _find_artifact(source.path, where)
        try:
            if artifact.name == SAVED_MODEL_FILE_NAME:
                signature = _load_saved_model(artifact.parent)
            else:
                signature = _load_keras(artifact)
            inputs = with_ranges(
                agreed_specs("input", source.config.inputs, signature.inputs), signature.ranges
            )
            outputs = agreed_specs("output", source.config.outputs, signature.outputs)
            serve = _serving_function(signature, inputs, outputs)
            model = TensorFlowModel(
                name=source.name,
                version=source.version,
                artifact=artifact,
                inputs=inputs,
                outputs=outputs,
                serve=serve,
                keepalive=signature.keepalive,
            )
            warm_up(
                model,
                functools.partial(_zeros, inputs),
                source.config.warmup,
                source.config.max_batch_size,
                f"{where} ({artifact.name})",
            )
        except SpecMismatch as exc:
            raise ModelLoadError(f"{where} ({artifact}): {exc}") from exc
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{where}: cannot load {artifact}: {type(exc).__name__}: {exc}") from exc
        return model


def _find_artifact(version_dir: Path, where: str) -> Path:
    if not version_dir.is_dir():
        raise ModelLoadError(f"{where}: version folder {version_dir} does not exist")
    saved_model = version_dir / SAVED_MODEL_FILE_NAME
    keras_files = sorted(version_dir.glob("*.keras"))
    if saved_model.exists() and keras_files:
        raise ModelLoadError(
            f"{where}: {version_dir} holds both a SavedModel ({saved_model.name}) and "
            f"{[p.name for p in keras_files]}; keep one"
        )
    if saved_model.exists():
        return saved_model
    if len(keras_files) == 1:
        return keras_files[0]
    if (version_dir / KERAS_FILE_NAME) in keras_files:
        return version_dir / KERAS_FILE_NAME
    if keras_files:
        raise ModelLoadError(
            f"{where}: {version_dir} holds several .keras files {[p.name for p in keras_files]}; "
            f"expected one, or one named {KERAS_FILE_NAME}"
        )
    legacy = sorted(p for p in version_dir.iterdir() if p.suffix.lower() in LEGACY_SUFFIXES)
    if legacy:
        raise ModelLoadError(
            f"{where}: {legacy[0]} is a legacy HDF5 model, which is not served; "
            f"load it with keras and save it as {KERAS_FILE_NAME} (model.save('{KERAS_FILE_NAME}'))"
        )
    found = sorted(p.name for p in version_dir.iterdir())
    raise ModelLoadError(
        f"{where}: no model in {version_dir}: expected {KERAS_FILE_NAME} or {SAVED_MODEL_FILE_NAME}; "
        f"found {found}"
    )


def _load_keras(path: Path) -> _Signature:
    model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    model_inputs = getattr(model, "inputs", None)
    if not model_inputs:
        raise SpecMismatch(
            f"{type(model).__name__} has no input signature; save a functional or Sequential model "
            "built with keras.Input"
        )
    inputs = tuple(
        TensorSpec(name=t.name, dtype=_dtype_name(t.dtype, f"input {t.name!r}"), shape=_row_shape(t.shape))
        for t in model_inputs
    )
    try:
        structure = model.input  # dict / list / single tensor, as the model was built
    except (AttributeError, ValueError):
        structure = model_inputs[0] if len(model_inputs) == 1 else list(model_inputs)
    declared_names = getattr(model, "output_names", None)

    def call(tensors: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        arguments = keras.tree.map_structure(lambda t: tensors[t.name], structure)
        return _named_outputs(model(arguments, training=False), declared_names)

    probe = tf.function(call).get_concrete_function(
        {spec.name: tf.TensorSpec((None, *_tf_shape(spec.shape)), spec.dtype) for spec in inputs}
    )
    outputs = tuple(
        TensorSpec(name=name, dtype=_dtype_name(t.dtype.name, f"output {name!r}"), shape=_row_shape(t.shape))
        for name, t in probe.structured_outputs.items()
    )
    return _Signature(
        artifact=path,
        inputs=inputs,
        outputs=outputs,
        call=call,
        keepalive=model,
        ranges=embedding_ranges(model),
    )


def _load_saved_model(folder: Path) -> _Signature:
    loaded = tf.saved_model.load(str(folder))
    signatures = getattr(loaded, "signatures", {})
    if SERVING_SIGNATURE not in signatures:
        raise SpecMismatch(f"no {SERVING_SIGNATURE!r} signature; found {sorted(signatures)}")
    signature = signatures[SERVING_SIGNATURE]
    positional, keyword = signature.structured_input_signature
    if positional:
        raise SpecMismatch(f"signature {SERVING_SIGNATURE!r} takes positional inputs; expected named ones")
    inputs = tuple(
        TensorSpec(name=name, dtype=_dtype_name(t.dtype.name, f"input {name!r}"), shape=_row_shape(t.shape))
        for name, t in keyword.items()
    )
    outputs = tuple(
        TensorSpec(name=name, dtype=_dtype_name(t.dtype.name, f"output {name!r}"), shape=_row_shape(t.shape))
        for name, t in signature.structured_outputs.items()
    )

    def call(tensors: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return dict(signature(**tensors))

    return _Signature(
        artifact=folder / SAVED_MODEL_FILE_NAME, inputs=inputs, outputs=outputs, call=call, keepalive=loaded
    )


def _serving_function(
    signature: _Signature, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
) -> tf.types.experimental.PolymorphicFunction:
    """One traced graph: declared inputs in, declared outputs out, casts inside."""
    model_dtypes = {spec.name: spec.dtype for spec in signature.inputs}
    model_output_dtypes = {spec.name: spec.dtype for spec in signature.outputs}
    input_signature = [tf.TensorSpec((None, *_tf_shape(spec.shape)), spec.dtype) for spec in inputs]

    @tf.function(input_signature=input_signature)
    def serve(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        by_name = {
            spec.name: _cast(tensor, spec.dtype, model_dtypes[spec.name])
            for spec, tensor in zip(inputs, tensors, strict=True)
        }
        results = signature.call(by_name)
        return {
            spec.name: _cast(results[spec.name], model_output_dtypes[spec.name], spec.dtype)
            for spec in outputs
        }

    serve.get_concrete_function()  # trace now, not on the first request
    return serve


def _cast(tensor: tf.Tensor, from_dtype: str, to_dtype: str) -> tf.Tensor:
    return tensor if from_dtype == to_dtype else tf.cast(tensor, to_dtype)


def _named_outputs(result: Any, declared_names: Sequence[str] | None) -> dict[str, tf.Tensor]:
    """Outputs keyed by name, whatever structure the model returns."""
    if isinstance(result, Mapping):
        return {str(name): tensor for name, tensor in result.items()}
    flat = list(result) if isinstance(result, (list, tuple)) else [result]
    names = list(declared_names or ())
    if len(names) != len(flat):
        names = [f"output_{index}" for index in range(len(flat))]
    return dict(zip(names, flat, strict=True))


def _row_shape(shape: Any) -> tuple[int, ...]:
    dims = list(tf.TensorShape(shape).as_list()) if shape is not None else None
    if not dims:
        raise SpecMismatch(
            f"tensor of shape {shape} has no batch dimension; export with a free batch dimension"
        )
    if dims[0] is not None:
        raise SpecMismatch(
            f"tensor of shape {tuple(dims)} has a fixed batch dimension {dims[0]}; "
            "export with a free batch dimension (None)"
        )
    return tuple(-1 if dim is None else int(dim) for dim in dims[1:])


def _tf_shape(shape: tuple[int, ...]) -> tuple[int | None, ...]:
    return tuple(None if dim == -1 else dim for dim in shape)


def _dtype_name(dtype: Any, what: str) -> str:
    name = str(getattr(dtype, "name", dtype))
    if name not in SUPPORTED_DTYPES:
        raise SpecMismatch(
            f"{what} has dtype {name}, which is not served; expected one of {SUPPORTED_DTYPES}"
        )
    return name


def _zeros(specs: tuple[TensorSpec, ...], rows: int) -> dict[str, np.ndarray]:
    return {spec.name: zeros(spec, rows) for spec in specs}
