"""The PyTorch backend (``model``): a torch.export program (``model.pt2``) or TorchScript (``model.pt``),
checked before torch reads it (``archive``, its zip bounded by ``zip_entries``), its tensors read from
the program (``specs``), placed on the process's device (``device``), its errors the runtime's
(``errors``). Importing this package imports torch."""

from udfserve.runtime.backends.pytorch.model import PLATFORM, PyTorchBackend, PyTorchModel

__all__ = ["PLATFORM", "PyTorchBackend", "PyTorchModel"]
