"""The ONNX Runtime backend (``model``): ``<model>/<version>/model.onnx`` in one session, opened with
the options of ``session``, its tensors read from the graph (``specs``), its errors the runtime's
(``errors``). Importing this package imports ONNX Runtime."""

from udfserve.runtime.backends.onnxruntime.model import PLATFORM, OnnxRuntimeBackend, OnnxRuntimeModel

__all__ = ["PLATFORM", "OnnxRuntimeBackend", "OnnxRuntimeModel"]
