"""A PyTorch model none of the examples use, exported the way a user exports theirs, and its
answers computed by torch in this process: what the backend, server and Spark tests serve from a
repository holding nothing but ``m/1/model.pt2``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

IMAGE_SHAPE = (1, 8, 8)
CLASSES = 3
SEED = 7


def build_conv_net() -> object:
    """Two inputs (an image and an integer offset per row), two named outputs (a dict)."""
    import torch

    class ConvNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, kernel_size=3, padding=1)
            self.pool = torch.nn.AdaptiveAvgPool2d(2)
            self.head = torch.nn.Linear(16, CLASSES)
            self.offsets = torch.nn.Embedding(5, CLASSES)

        def forward(self, image: torch.Tensor, offset: torch.Tensor) -> dict[str, torch.Tensor]:
            hidden = torch.relu(self.conv(image))
            logits = self.head(self.pool(hidden).flatten(1)) + self.offsets(offset)
            return {"probabilities": torch.softmax(logits, dim=-1), "energy": hidden.mean(dim=(1, 2, 3))}

    torch.manual_seed(SEED)
    return ConvNet().eval()


def export_conv_net(path: Path) -> Path:
    """``build_conv_net`` exported with a dynamic batch and saved to ``path`` (a ``.pt2``)."""
    import torch

    module = build_conv_net()
    batch = torch.export.Dim("batch")
    program = torch.export.export(
        module,  # type: ignore[arg-type]
        (torch.zeros(4, *IMAGE_SHAPE), torch.zeros(4, dtype=torch.int64)),
        dynamic_shapes={"image": {0: batch}, "offset": {0: batch}},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, path)
    return path


def conv_net_repository(root: Path) -> Path:
    """A repository holding only ``m/1/model.pt2``: no config.yaml."""
    export_conv_net(root / "m" / "1" / "model.pt2")
    return root


def conv_net_inputs(ids: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs from row ids, as Spark computes them (``spark_data.feature_values`` and ``id % 5``)."""
    from spark_data import feature_values

    return {"image": feature_values(ids, IMAGE_SHAPE), "offset": (ids % 5).astype(np.int64)}


def torch_outputs(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What torch computes in this process, calling the saved program."""
    import torch

    module = torch.export.load(path).module()
    with torch.inference_mode():
        result = module(torch.from_numpy(inputs["image"].copy()), torch.from_numpy(inputs["offset"].copy()))
    return {name: value.numpy().copy() for name, value in result.items()}
