"""The PyTorch example: ``tabular_mlp`` as a torch module with the Keras model's weights, exported.

``tabular_mlp_torch`` computes what the Keras ``tabular_mlp`` computes (same seeded weights, to
1e-5), so the two backends can be served and benchmarked side by side on one model. It is saved
the way a user would save theirs: ``torch.export.export`` with a dynamic batch dimension, then
``torch.export.save`` to ``<repo>/tabular_mlp_torch/1/model.pt2``; the program names its input
``features`` (``forward``'s parameter) and its output ``probabilities`` (the key of the dict
``forward`` returns), as the Keras model does.

Written only when asked (``udfserve models generate --torch``): the default repository stays what
the default install can serve, without torch.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras
    import torch

logger = logging.getLogger(__name__)

TORCH_EXAMPLE = "tabular_mlp_torch"
KERAS_TWIN = "tabular_mlp"
EXPORT_FILE_NAME = "model.pt2"
TORCH_HELP = (
    "also write tabular_mlp_torch: tabular_mlp's weights in a torch module, exported with torch.export "
    "to model.pt2 (needs the torch extra)"
)
"""The help of ``udfserve models generate --torch``."""
EXAMPLE_ROWS = 4
"""Rows of the example input export traces with; the batch dimension is dynamic, any count runs."""


def torch_mlp_from_keras(model: keras.Model) -> torch.nn.Module:
    """``tabular_mlp``'s layers as torch layers holding the same weights (Dense kernels transposed)."""
    import torch

    class TabularMLP(torch.nn.Module):
        """64 -> 256 -> 256 -> 8, ReLU, softmax; returns ``{"probabilities": ...}``."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(64, 256),
                torch.nn.ReLU(),
                torch.nn.Linear(256, 256),
                torch.nn.ReLU(),
                torch.nn.Linear(256, 8),
                torch.nn.Softmax(dim=-1),
            )

        def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"probabilities": self.layers(features)}

    module = TabularMLP()
    linears = [layer for layer in module.layers if isinstance(layer, torch.nn.Linear)]
    dense = [model.get_layer(name) for name in ("dense_1", "dense_2", "probabilities")]
    with torch.no_grad():
        for linear, layer in zip(linears, dense, strict=True):
            kernel, bias = (weight.numpy() for weight in layer.weights)
            linear.weight.copy_(torch.from_numpy(kernel.T.copy()))
            linear.bias.copy_(torch.from_numpy(bias.copy()))
    return module.eval()


def export_program(module: torch.nn.Module, features: int = 64) -> torch.export.ExportedProgram:
    """``module`` exported with a dynamic batch dimension on its one input ``features``."""
    import torch

    batch = torch.export.Dim("batch")
    example = torch.zeros(EXAMPLE_ROWS, features)
    return torch.export.export(module, (example,), dynamic_shapes={"features": {0: batch}})


def generate_torch_examples(root: Path, *, overwrite: bool = False) -> list[str]:
    """Write ``tabular_mlp_torch`` under ``root`` (kept when present unless ``overwrite``)."""
    from udfserve.runtime.backends.tensorflow.framework import import_tensorflow
    from udfserve.services.examples.generate_models import EXAMPLES, _kept, _write_model

    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError(
            f"{TORCH_EXAMPLE} is a PyTorch model and torch is not installed here; expected "
            "`pip install 'udfserve[torch]'` (docs/installing.md, \"PyTorch\": the CPU build first on a "
            "machine without a GPU)"
        )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if not overwrite and _kept(root / TORCH_EXAMPLE):
        return [TORCH_EXAMPLE]
    import_tensorflow()  # before keras imports it: its start-up lines go through the filter
    import keras

    build, seed, config = EXAMPLES[KERAS_TWIN]
    keras.utils.set_random_seed(seed)
    program = export_program(torch_mlp_from_keras(build()))
    _write_model(root, TORCH_EXAMPLE, config, partial(_save_program, program))
    return [TORCH_EXAMPLE]


def _save_program(program: torch.export.ExportedProgram, version_dir: Path) -> None:
    import torch

    torch.export.save(program, version_dir / EXPORT_FILE_NAME)
