"""A Triton model repository serving example Keras models through Triton's python backend.

The counterpart of what udfserve serves: the same ``model.keras`` file, called through one
``tf.function`` with a fixed input signature (as udfserve's TensorFlow backend does), the same
version, ``max_batch_size`` and dynamic-batching delay, so the two servers differ in their
serving machinery only.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from udfserve.runtime.model_config import ModelConfig

CONFIG_TEMPLATE = """\
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
  {{
    name: "{input_name}"
    data_type: TYPE_FP32
    dims: [ {input_dims} ]
  }}
]
output [
  {{
    name: "{output_name}"
    data_type: TYPE_FP32
    dims: [ {output_dims} ]
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {max_queue_delay_us}
}}
instance_group [
  {{
    kind: KIND_CPU
    count: 1
  }}
]
"""

MODEL_PY_TEMPLATE = '''\
"""Runs {name}/{version}/model.keras for Triton's python backend (written by benchmarks/kserve)."""

import sys

# The backend stub ignores PYTHONPATH: the environment holding numpy<2 and TensorFlow goes first.
SITE_PACKAGES = {site_packages!r}
if SITE_PACKAGES not in sys.path:
    sys.path.insert(0, SITE_PACKAGES)

from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

INPUT, OUTPUT, ROW_SHAPE = {input_name!r}, {output_name!r}, {input_shape!r}


class TritonPythonModel:
    def initialize(self, args):
        model = keras.saving.load_model(Path(__file__).with_name("model.keras"), compile=False)
        spec = tf.TensorSpec((None, *ROW_SHAPE), tf.float32)
        self._serve = tf.function(lambda x: model(x, training=False), input_signature=[spec])
        self._serve(np.zeros((1, *ROW_SHAPE), np.float32))  # trace now, not on the first request
        self._model = model

    def execute(self, requests):
        """Every request of the dynamic batch in one call, split back by row counts."""
        arrays = [pb_utils.get_input_tensor_by_name(r, INPUT).as_numpy() for r in requests]
        outputs = self._serve(np.concatenate(arrays) if len(arrays) > 1 else arrays[0]).numpy()
        bounds = np.cumsum([len(a) for a in arrays])[:-1]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT, part)])
            for part in np.split(outputs, bounds)
        ]
'''


@dataclass(frozen=True)
class TritonModel:
    """One FP32 input and one FP32 output, with per-row shapes, as the example repository declares."""

    name: str
    version: int
    input_name: str
    input_shape: tuple[int, ...]
    output_name: str
    output_shape: tuple[int, ...]
    max_batch_size: int
    max_queue_delay_us: int = 2000


EXAMPLE_MODELS = {
    model.name: model
    for model in (
        TritonModel("tabular_mlp", 1, "features", (64,), "probabilities", (8,), max_batch_size=1024),
        TritonModel(
            "sequence_bilstm", 1, "lines", (16, 32), "class_probabilities", (4,), max_batch_size=4096
        ),
    )
}
"""The example repository's single-input FP32 models (``services/examples/generate_models.py``).
``write_example_repository`` takes their versions, batch limits and delays from the repository."""


def write_triton_model(root: Path, keras_file: Path, site_packages: str, model: TritonModel) -> Path:
    """``root/<name>/config.pbtxt`` and ``root/<name>/<version>/{model.py, model.keras}``."""
    version_dir = root / model.name / str(model.version)
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(keras_file, version_dir / "model.keras")
    fields = {
        "name": model.name,
        "version": model.version,
        "input_name": model.input_name,
        "input_dims": ", ".join(str(d) for d in model.input_shape),
        "input_shape": tuple(model.input_shape),
        "output_name": model.output_name,
        "output_dims": ", ".join(str(d) for d in model.output_shape),
        "max_batch_size": model.max_batch_size,
        "max_queue_delay_us": model.max_queue_delay_us,
        "site_packages": site_packages,
    }
    (root / model.name / "config.pbtxt").write_text(CONFIG_TEMPLATE.format(**fields), encoding="utf-8")
    (version_dir / "model.py").write_text(MODEL_PY_TEMPLATE.format(**fields), encoding="utf-8")
    return root


def write_triton_repository(
    root: Path, keras_file: Path, site_packages: str, model: TritonModel = EXAMPLE_MODELS["tabular_mlp"]
) -> Path:
    """A repository of one model (``tabular_mlp`` unless told) from ``keras_file``; returns ``root``."""
    return write_triton_model(root, keras_file, site_packages, model)


def write_example_repository(
    root: Path, udfserve_repository: Path, site_packages: str, names: Iterable[str]
) -> Path:
    """The example repository's models ``names`` as a Triton repository, each from the
    ``model.keras`` of its newest version in ``udfserve_repository``, under the same version, with
    the ``max_batch_size`` and batching delay of its ``config.yaml``."""
    for name in names:
        model = EXAMPLE_MODELS.get(name)
        if model is None:
            raise ValueError(
                f"no Triton description of model {name!r}; expected one of {list(EXAMPLE_MODELS)}"
            )
        versions = [int(d.name) for d in (udfserve_repository / name).glob("*") if d.name.isdigit()]
        keras_file = udfserve_repository / name / str(max(versions, default=0)) / "model.keras"
        if not keras_file.is_file():
            raise FileNotFoundError(
                f"{keras_file} not found: expected model {name!r} under <version>/model.keras in "
                f"{udfserve_repository}"
            )
        config = ModelConfig.model_validate(
            yaml.safe_load((udfserve_repository / name / "config.yaml").read_text(encoding="utf-8")) or {}
        )
        served = replace(
            model,
            version=max(versions),
            max_batch_size=config.max_batch_size,
            max_queue_delay_us=round(config.dynamic_batching.max_queue_delay_s * 1e6),
        )
        write_triton_model(root, keras_file, site_packages, served)
    return root
