"""The GPU check's model repository, and the CPU's answers to compare the servers' with.

Written in a child process with every GPU hidden (``python -m benchmarks.gpu_check.models
OUTPUT PLAN_JSON``), so that the check's own process never imports torch and the exports run on
the CPU, as a user's would on a build machine. The models are written the way the examples are:
the torch ones exported by ``udfserve.services.examples.torch_models.export_program`` (one flat
``features`` input with a free batch dimension), the ONNX ones built with ``onnx.helper`` as
``udfserve.services.examples.onnx_models`` builds ``tabular_mlp_onnx``:

- ``heavy_conv`` (torch): a conv net over ``side`` x ``side`` images sent as flat
  ``array<float>`` rows, four 3x3 convolutions; the compute-heavy model.
- ``mlp_onnx`` (ONNX): ``tabular_mlp``'s shape, 64 -> 256 -> 256 -> 8, seeded weights.
- ``null_onnx`` (ONNX): the first 8 of 64 values, no arithmetic: the serving path's ceiling.
- ``wide_oom`` (torch): 16 -> ``width`` -> 4; every row holds two float32 vectors of ``width``
  while it runs, so a big batch needs more memory than a cap allows. Loaded without a warm-up,
  which would run it at its full batch size.

``references.npz`` holds, for the serve check's models, 64 seeded input rows and the CPU's
answers to them.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import yaml

from benchmarks.gpu_check.plan import Plan

logger = logging.getLogger(__name__)

HEAVY, MLP, NULL, OOM = "heavy_conv", "mlp_onnx", "null_onnx", "wide_oom"
OOM_FEATURES = 4 * 4
REFERENCE_ROWS = 64
REFERENCES_FILE = "references.npz"
INPUT = "features"
OUTPUTS = {HEAVY: "probabilities", MLP: "probabilities", NULL: "prediction", OOM: "scores"}
"""The one output of each model."""


def features_of(plan: Plan, model: str) -> int:
    """The width of ``model``'s one input."""
    return {HEAVY: plan.heavy_features, MLP: plan.mlp_features, NULL: plan.mlp_features, OOM: OOM_FEATURES}[
        model
    ]


def rows_of(count: int, features: int, seed: int) -> np.ndarray:
    """``count`` seeded rows of ``features`` float32 values, as every process of the check makes them."""
    return np.random.default_rng(seed).standard_normal((count, features), dtype=np.float32)


def write_config(model_dir: Path, config: Mapping[str, Any]) -> None:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")


def heavy_module(side: int, channels: Sequence[int]) -> Any:
    """The conv net: four 3x3 convolutions (ReLU, two 2x2 max-pools), a global mean, ten classes."""
    import torch

    first, second, third = channels

    class HeavyConv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(1, first, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(first, second, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(second, third, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(third, third, 3, padding=1),
                torch.nn.ReLU(),
            )
            self.head = torch.nn.Linear(third, 10)

        def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
            hidden = self.body(features.reshape(-1, 1, side, side)).mean(dim=(2, 3))
            return {"probabilities": torch.softmax(self.head(hidden), dim=-1)}

    return HeavyConv().eval()


def wide_module(width: int) -> Any:
    """16 -> ``width`` (ReLU) -> 4: what a row needs grows with ``width``, its answer does not."""
    import torch

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(OOM_FEATURES, width)
            self.down = torch.nn.Linear(width, 4)

        def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"scores": self.down(torch.relu(self.up(features)))}

    return Wide().eval()


def null_graph(features: int, kept: int) -> Any:
    """The first ``kept`` of ``features`` values of each row: no arithmetic at all."""
    from onnx import TensorProto, helper, numpy_helper

    from udfserve.services.examples.onnx_models import IR_VERSION, OPSET

    constants = {"starts": [0], "ends": [kept], "axes": [1]}
    graph = helper.make_graph(
        [helper.make_node("Slice", [INPUT, "starts", "ends", "axes"], ["prediction"])],
        NULL,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", kept])],
        initializer=[numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="udfserve")
    model.ir_version = IR_VERSION
    return model


def mlp_graph(features: int, seed: int) -> Any:
    """``tabular_mlp``'s layers (features -> 256 -> 256 -> 8) with seeded Glorot-scaled weights."""
    from udfserve.services.examples.onnx_models import dense_stack_graph

    rng = np.random.default_rng(seed)
    sizes = [(features, 256, "Relu"), (256, 256, "Relu"), (256, 8, "Softmax")]
    layers = [
        (rng.normal(0, np.sqrt(2 / (n_in + n_out)), (n_in, n_out)), np.zeros(n_out), activation)
        for n_in, n_out, activation in sizes
    ]
    return dense_stack_graph(MLP, layers, input_name=INPUT, output_name="probabilities")


def write_repository(root: Path, plan: Plan) -> dict[str, np.ndarray]:
    """Write the four models under ``root``; the CPU's answers to ``REFERENCE_ROWS`` rows of the
    serve check's models (``<model>/input`` and ``<model>/output``)."""
    import onnxruntime as ort
    import torch

    from udfserve.services.examples.torch_models import export_program

    torch.manual_seed(plan.seed)
    batching = {"dynamic_batching": {"max_queue_delay_s": 0.002}}
    references: dict[str, np.ndarray] = {}

    heavy = heavy_module(plan.heavy_side, plan.heavy_channels)
    write_config(root / HEAVY, {"max_batch_size": plan.heavy_max_batch_size, **batching})
    torch.export.save(export_program(heavy, plan.heavy_features), root / HEAVY / "1" / "model.pt2")
    heavy_input = rows_of(REFERENCE_ROWS, plan.heavy_features, plan.seed)
    with torch.inference_mode():
        references[f"{HEAVY}/output"] = heavy(torch.from_numpy(heavy_input))["probabilities"].numpy()
    references[f"{HEAVY}/input"] = heavy_input

    wide = wide_module(plan.oom_width)
    write_config(root / OOM, {"max_batch_size": plan.oom_request_rows, "warmup": False, **batching})
    torch.export.save(export_program(wide, OOM_FEATURES), root / OOM / "1" / "model.pt2")

    for name, graph in (
        (MLP, mlp_graph(plan.mlp_features, plan.seed)),
        (NULL, null_graph(plan.mlp_features, plan.null_outputs)),
    ):
        write_config(root / name, {"max_batch_size": 8192, **batching})
        (root / name / "1" / "model.onnx").write_bytes(graph.SerializeToString())
    mlp_input = rows_of(REFERENCE_ROWS, plan.mlp_features, plan.seed)
    session = ort.InferenceSession(str(root / MLP / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    references[f"{MLP}/output"] = session.run(None, {INPUT: mlp_input})[0]
    references[f"{MLP}/input"] = mlp_input
    np.savez(root / REFERENCES_FILE, **cast("dict[str, Any]", references))
    return references


def read_references(root: Path) -> dict[str, np.ndarray]:
    with np.load(root / REFERENCES_FILE) as data:
        return {name: data[name] for name in data.files}


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    output, plan_json = Path(argv[0]), json.loads(argv[1])
    plan = Plan(**{**plan_json, "heavy_channels": tuple(plan_json["heavy_channels"])})
    write_repository(output, plan)
    print(json.dumps({"models": sorted(p.name for p in output.iterdir() if p.is_dir())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
