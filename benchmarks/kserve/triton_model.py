"""A Triton model repository serving an example Keras model through Triton's python backend.

The counterpart of what udfserve serves: the same ``model.keras`` file, called through one
``tf.function`` with a fixed input signature (as udfserve's TensorFlow backend does), the same
``max_batch_size`` and the same dynamic-batching delay, so the two servers differ in their
serving machinery only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CONFIG_TEMPLATE = """\
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
  {{
    name: "{input_name}"
    data_type: TYPE_FP32
    dims: [ {input_width} ]
  }}
]
output [
  {{
    name: "{output_name}"
    data_type: TYPE_FP32
    dims: [ {output_width} ]
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
"""Runs {name}/1/model.keras for Triton's python backend (written by benchmarks/kserve)."""

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

INPUT, OUTPUT, WIDTH = {input_name!r}, {output_name!r}, {input_width}


class TritonPythonModel:
    def initialize(self, args):
        model = keras.saving.load_model(Path(__file__).with_name("model.keras"), compile=False)
        spec = tf.TensorSpec((None, WIDTH), tf.float32)
        self._serve = tf.function(lambda x: model(x, training=False), input_signature=[spec])
        self._serve(np.zeros((1, WIDTH), np.float32))  # trace now, not on the first request
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


def write_triton_repository(
    root: Path,
    keras_file: Path,
    site_packages: str,
    *,
    name: str = "tabular_mlp",
    input_name: str = "features",
    input_width: int = 64,
    output_name: str = "probabilities",
    output_width: int = 8,
    max_batch_size: int = 1024,
    max_queue_delay_us: int = 2000,
) -> Path:
    """``root/<name>/config.pbtxt`` and ``root/<name>/1/{model.py, model.keras}``; returns ``root``."""
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(keras_file, version_dir / "model.keras")
    fields = {
        "name": name,
        "input_name": input_name,
        "input_width": input_width,
        "output_name": output_name,
        "output_width": output_width,
        "max_batch_size": max_batch_size,
        "max_queue_delay_us": max_queue_delay_us,
        "site_packages": site_packages,
    }
    (root / name / "config.pbtxt").write_text(CONFIG_TEMPLATE.format(**fields), encoding="utf-8")
    (version_dir / "model.py").write_text(MODEL_PY_TEMPLATE.format(**fields), encoding="utf-8")
    return root
