"""The TensorFlow backend (``model``): a Keras file or a SavedModel, traced once and called as a graph.

Importing this package imports TensorFlow, through ``framework.import_tensorflow`` first, so that
the framework's start-up lines go through its filter; ``backends.get_backend`` imports it only to
load a model, once the process is pinned to its device.
"""

from udfserve.runtime.backends.tensorflow.framework import import_tensorflow

import_tensorflow()

from udfserve.runtime.backends.tensorflow.model import TensorFlowBackend, TensorFlowModel  # noqa: E402

__all__ = ["TensorFlowBackend", "TensorFlowModel", "import_tensorflow"]
