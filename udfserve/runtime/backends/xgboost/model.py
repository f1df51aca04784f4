"""XGBoost backend: ``<model>/<version>/model.ubj`` or ``model.json``, one booster per version.

The file is read by ``Booster.load_model``, in XGBoost's own formats only (UBJSON, JSON): no
pickle is ever read, and a booster is data, trees and numbers, that runs no code of its own.
config.yaml is optional: the one input and the output are read from the booster (``specs``),
and declared ones must agree with it. A file that does not load, a ``gblinear`` booster (no
in-place prediction), or specs that disagree are refused at load with a ``ModelLoadError``
naming the file (``errors``).

Each call is one ``Booster.inplace_predict`` on the request's float32 matrix, read where it
lies (no DMatrix is built), NaN taken as missing; the answer is XGBoost's float32 array, per row
as the objective gives it. Threads: one core short of the process's (``settings``). Device: the
GPU of a process pinned to one, else the CPU, said once per model when a GPU-pinned process
computes on the CPU (``placement``). A version is warmed up through ``warmup.warm_up``.

A call cannot be stopped: XGBoost offers no way to end a prediction running in another thread,
so the backend registers no stop with ``call_bound.on_overrun``. A call past the server's bound
is then handled as any that cannot be stopped (the server fails what the model holds and exits
for a fresh process); a booster's calls take milliseconds, bounded by its trees and the rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xgboost
from xgboost.core import XGBoostError

from udfserve.runtime.backend_registry import FORMAT_BY_BACKEND
from udfserve.runtime.backends.base import BackendModel
from udfserve.runtime.backends.spec_agreement import SpecMismatch
from udfserve.runtime.backends.warmup import warm_up
from udfserve.runtime.backends.xgboost import placement
from udfserve.runtime.backends.xgboost.errors import CALL_ERRORS, call_error, load_error
from udfserve.runtime.backends.xgboost.settings import XGBoostSettings, call_threads, read_settings
from udfserve.runtime.backends.xgboost.specs import booster_specs
from udfserve.runtime.errors import BackendFault, InvalidInput, ModelLoadError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import TensorSpec, shape_text, zeros

logger = logging.getLogger(__name__)

PLATFORM = "xgboost"
FILE_NAMES = FORMAT_BY_BACKEND[PLATFORM].files
"""The booster's file, in XGBoost's UBJSON or JSON format (``Booster.save_model`` picks by suffix),
as the backend's registry entry names them."""

_settings: XGBoostSettings | None = None
_settings_lock = threading.Lock()


def _process_settings(where: str) -> XGBoostSettings:
    """The settings, read and announced once per process; ``ModelLoadError`` naming the model and the invalid
    variable (read again at the next load, so a fixed environment is taken)."""
    global _settings
    with _settings_lock:
        if _settings is None:
            try:
                _settings = read_settings()
            except ValueError as exc:
                raise ModelLoadError(f"{where}: {exc}") from None
            logger.info(
                "xgboost %s: %d thread(s) a call on the CPU; %s",
                xgboost.__version__,
                call_threads(_settings),
                "built with CUDA" if placement.xgboost_has_cuda() else "built without CUDA",
            )
        return _settings


class XGBoostModel(BackendModel):
    """A loaded booster. ``predict`` is blocking and safe to call from several threads
    (``inplace_predict`` takes no lock, and nothing else is called on the booster once loaded)."""

    def __init__(
        self,
        *,
        name: str,
        version: int,
        artifact: Path,
        booster: Any,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        objective: str,
        num_features: int,
        device: str,
        threads: int,
    ) -> None:
        super().__init__(name=name, version=version, artifact=artifact, inputs=inputs, outputs=outputs)
        self.platform = f"{PLATFORM}_{artifact.suffix.lstrip('.')}"
        """``xgboost_ubj`` or ``xgboost_json``, the model types of Triton's FIL backend."""
        self.objective = objective
        self.num_features = num_features
        self.device = device
        self.threads = threads
        self._booster = booster

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        spec = self.inputs[0]
        if spec.name not in inputs:
            raise InvalidInput(f"model {self.name!r}: missing input {spec.name!r}; received {sorted(inputs)}")
        features = inputs[spec.name]
        if features.ndim != 2 or features.shape[1] != self.num_features:
            raise InvalidInput(
                f"model {self.name!r}: input {spec.name!r} has per-row shape "
                f"{shape_text(features.shape[1:])}; expected {shape_text(spec.shape)}: the booster was "
                f"trained on {self.num_features} features"
            )
        rows = len(features)
        # no stop registered with call_bound: XGBoost cannot stop a running prediction
        try:
            result = placement.predict(self._booster, features, self.device)
        except CALL_ERRORS as exc:
            raise call_error(self.name, rows, exc) from exc
        output = self.outputs[0]
        expected = (rows, *output.shape)
        if result.shape != expected:
            if result.size != int(np.prod(expected)):
                raise BackendFault(
                    f"model {self.name!r}: xgboost answered {rows} rows with shape {list(result.shape)}; "
                    f"expected {list(expected)} for objective {self.objective}"
                )
            result = result.reshape(expected)  # an empty batch comes back flat
        return {output.name: result if result.dtype == output.dtype else result.astype(output.dtype)}

    def described(self) -> dict[str, object]:
        return {"objective": self.objective, "device": self.device}


class XGBoostBackend:
    """Loads ``<version>/model.ubj`` or ``model.json`` into an XGBoost booster."""

    platform = PLATFORM

    def load(self, source: ModelSource) -> XGBoostModel:
        where = f"model {source.name!r} version {source.version}"
        settings = _process_settings(where)
        artifact = _find_artifact(source.path, where)
        booster = xgboost.Booster()
        try:
            booster.load_model(str(artifact))  # XGBoost's JSON or UBJSON, never a pickle
        except (XGBoostError, UnicodeDecodeError) as exc:  # the second: its message quoted binary bytes
            raise ModelLoadError(load_error(where, artifact, exc)) from exc
        try:
            specs = booster_specs(booster, source.config.inputs, source.config.outputs)
        except SpecMismatch as exc:
            raise ModelLoadError(f"{where} ({artifact}): {exc}") from exc
        threads = call_threads(settings)
        booster.set_param({"nthread": threads})
        chosen = placement.place(booster, specs.num_features, f"{where} ({artifact.name})")
        model = XGBoostModel(
            name=source.name,
            version=source.version,
            artifact=artifact,
            booster=booster,
            inputs=specs.inputs,
            outputs=specs.outputs,
            objective=specs.objective,
            num_features=specs.num_features,
            device=chosen.device,
            threads=threads,
        )
        warm_up(
            model,
            lambda rows: {spec.name: zeros(spec, rows) for spec in specs.inputs},
            source.config.warmup,
            source.config.max_batch_size,
            f"{where} ({artifact.name})",
        )
        return model


def _find_artifact(version_dir: Path, where: str) -> Path:
    if not version_dir.is_dir():
        raise ModelLoadError(f"{where}: version folder {version_dir} does not exist")
    present = [version_dir / name for name in FILE_NAMES if (version_dir / name).is_file()]
    if len(present) == 1:
        return present[0]
    found = sorted(path.name for path in version_dir.iterdir())
    if present:
        raise ModelLoadError(
            f"{where}: {version_dir} holds {' and '.join(FILE_NAMES)}; expected one booster file, "
            f"found {found}"
        )
    raise ModelLoadError(f"{where}: no {' or '.join(FILE_NAMES)} in {version_dir}; found {found}")
