"""ONNX Runtime backend: ``<model>/<version>/model.onnx``, served through one ``InferenceSession``.

Inputs and outputs are read from the graph (``specs``): every tensor's first
dimension must be a free batch dimension; config.yaml is optional and, when it declares inputs or
outputs, they must agree with the graph's. The session is opened once at load with the options
of ``session`` (threads that leave a core to the event loop, no spinning, graph
optimisation ALL; the CUDA provider on a GPU-pinned process) and warmed up with a one-row call
and a ``max_batch_size`` call (``warmup``), so the first request pays no allocation of the arena.

An ONNX graph is data: it runs ONNX Runtime's own operators and cannot run Python, and no
custom-op library is ever registered. A file that does not parse, a graph with an operator the
runtime lacks, a tensor without a batch dimension or of an element type the server does not
carry is refused at load with a ``ModelLoadError`` naming the file (``errors``).

Copies: on the CPU, ``InferenceSession.run`` reads a contiguous numpy input of the graph's
dtype in place and hands its outputs back as numpy arrays over ONNX Runtime's own buffers, so a
call copies neither way (running through ``OrtValue``s or I/O binding copies nothing more away
and costs more Python per call: docs/backends.md). Strings are the exception: the server carries
them as UTF-8 ``bytes``, ONNX Runtime's Python API as ``str``, so they are decoded in and encoded
out. A declared numeric dtype other than the graph's is cast at the call.

Every call runs with its own ``RunOptions``: the server's bound on one call stops it through them
(``terminate``, ``udfserve.runtime.call_bound``), and ONNX Runtime gives its CPU arena back after
each call (``session.run_options``), so one large call does not keep its memory.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from udfserve.runtime.backends.base import BackendModel
from udfserve.runtime.backends.onnxruntime.errors import CALL_ERRORS, call_error, load_error
from udfserve.runtime.backends.onnxruntime.session import (
    OnnxRuntimeSettings,
    announce,
    check_device,
    providers,
    read_settings,
    run_options,
    session_options,
)
from udfserve.runtime.backends.onnxruntime.specs import graph_specs
from udfserve.runtime.backends.spec_agreement import SpecMismatch, agreed_specs
from udfserve.runtime.backends.warmup import warm_up
from udfserve.runtime.call_bound import on_overrun
from udfserve.runtime.errors import InvalidInput, ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import STRING_DTYPE, TensorSpec, zeros

PLATFORM = "onnxruntime_onnx"
"""Triton's name for the same backend and format."""
ONNX_FILE_NAME = "model.onnx"

_settings: OnnxRuntimeSettings | None = None
_settings_lock = threading.Lock()


def _process_settings(where: str) -> OnnxRuntimeSettings:
    """The settings, read and announced once per process; ``ModelLoadError`` naming the model and
    the invalid variable (read again at the next load, so a fixed environment is taken)."""
    global _settings
    with _settings_lock:
        if _settings is None:
            try:
                _settings = read_settings()
            except ValueError as exc:
                raise ModelLoadError(f"{where}: {exc}") from None
            announce(_settings, ort.get_available_providers())
        return _settings


class OnnxRuntimeModel(BackendModel):
    """A loaded graph. ``predict`` is blocking and safe to call from several threads (ONNX Runtime
    runs concurrent calls of one session)."""

    platform = PLATFORM

    def __init__(
        self,
        *,
        name: str,
        version: int,
        artifact: Path,
        session: ort.InferenceSession,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        graph_dtypes: Mapping[str, str],
        settings: OnnxRuntimeSettings,
    ) -> None:
        super().__init__(name=name, version=version, artifact=artifact, inputs=inputs, outputs=outputs)
        self.providers: tuple[str, ...] = tuple(session.get_providers())
        self._session = session
        self._graph_dtypes = dict(graph_dtypes)
        self._output_names = [spec.name for spec in outputs]
        self._settings = settings

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.require_inputs(inputs)
        feeds = {spec.name: self._feed(spec, inputs[spec.name]) for spec in self.inputs}
        options = run_options(self._settings)
        on_overrun(functools.partial(_terminate, options))  # the server's bound on one call
        try:
            results = self._session.run(self._output_names, feeds, options)
        except CALL_ERRORS as exc:
            raise call_error(self.name, self.rows(inputs), exc) from exc
        return {
            spec.name: self._answer(spec, result) for spec, result in zip(self.outputs, results, strict=True)
        }

    def _feed(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        graph_dtype = self._graph_dtypes[spec.name]
        if graph_dtype == STRING_DTYPE:
            return _decoded(self.name, spec.name, array)
        return array if array.dtype == graph_dtype else array.astype(graph_dtype)

    def _answer(self, spec: TensorSpec, result: np.ndarray) -> np.ndarray:
        if spec.dtype == STRING_DTYPE:
            return _encoded(result)
        return result if result.dtype == spec.dtype else result.astype(spec.dtype)

    def described(self) -> dict[str, object]:
        return {"providers": list(self.providers)}


class OnnxRuntimeBackend:
    """Loads ``<version>/model.onnx`` into an ONNX Runtime session."""

    platform = PLATFORM

    def load(self, source: ModelSource) -> OnnxRuntimeModel:
        where = f"model {source.name!r} version {source.version}"
        settings = _process_settings(where)
        artifact = _find_artifact(source.path, where)
        available = ort.get_available_providers()
        try:
            session = ort.InferenceSession(
                str(artifact),
                sess_options=session_options(settings),
                providers=providers(settings, available),
            )
        except Exception as exc:  # ONNX Runtime's status classes derive from Exception only
            raise ModelLoadError(load_error(where, artifact, exc)) from exc
        check_device(session.get_providers(), available, f"{where} ({artifact.name})")
        try:
            graph_inputs = graph_specs("input", session.get_inputs())
            graph_outputs = graph_specs("output", session.get_outputs())
            inputs = agreed_specs("input", source.config.inputs, graph_inputs, holder="graph")
            outputs = agreed_specs("output", source.config.outputs, graph_outputs, holder="graph")
        except SpecMismatch as exc:
            raise ModelLoadError(f"{where} ({artifact}): {exc}") from exc
        model = OnnxRuntimeModel(
            name=source.name,
            version=source.version,
            artifact=artifact,
            session=session,
            inputs=inputs,
            outputs=outputs,
            graph_dtypes={spec.name: spec.dtype for spec in (*graph_inputs, *graph_outputs)},
            settings=settings,
        )
        warm_up(
            model,
            lambda rows: {spec.name: zeros(spec, rows) for spec in inputs},
            source.config.warmup,
            source.config.max_batch_size,
            f"{where} ({artifact.name})",
        )
        return model


def _terminate(options: ort.RunOptions) -> None:
    """Stop the call running with ``options``: ONNX Runtime checks the flag between kernels (and
    a ``Loop``'s iterations) and fails the call."""
    options.terminate = True


def _find_artifact(version_dir: Path, where: str) -> Path:
    if not version_dir.is_dir():
        raise ModelLoadError(f"{where}: version folder {version_dir} does not exist")
    artifact = version_dir / ONNX_FILE_NAME
    if not artifact.is_file():
        found = sorted(path.name for path in version_dir.iterdir())
        raise ModelLoadError(f"{where}: no {ONNX_FILE_NAME} in {version_dir}; found {found}")
    return artifact


def _decoded(model: str, name: str, array: np.ndarray) -> np.ndarray:
    """An object array of UTF-8 ``bytes`` as the object array of ``str`` ONNX Runtime takes."""
    flat = array.reshape(-1)
    texts = np.empty(flat.shape, dtype=object)
    for index, value in enumerate(flat):
        try:
            texts[index] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"model {model!r}: input {name!r} element {index} is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); expected UTF-8, which ONNX string tensors hold"
            ) from None
    return texts.reshape(array.shape)


def _encoded(result: np.ndarray) -> np.ndarray:
    """ONNX Runtime's string output (``str`` objects) as the server's object array of ``bytes``."""
    flat = result.reshape(-1)
    encoded = np.empty(flat.shape, dtype=object)
    for index, value in enumerate(flat):
        encoded[index] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return encoded.reshape(result.shape)
