"""The example ``tabular_mlp`` as an ONNX graph with the Keras model's own weights.

The graph is written with ``onnx.helper`` from the Dense layers' kernels and biases (MatMul, Add,
Relu, Softmax): no converter (tf2onnx) is needed, and what the graph computes is plain to read.
Its predictions equal the Keras model's to 1e-5 (``tests/backend/test_onnxruntime_backend.py``).
The benchmarks serve it next to the Keras original; ``udfserve models generate --onnx`` writes it
as ``tabular_mlp_onnx``. Needs the ``onnx`` package (``pip install onnx``), not ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras

ONNX_FILE_NAME = "model.onnx"
ONNX_SUFFIX = "_onnx"
OPSET = 17
"""An opset every onnxruntime the ``onnx`` extra allows (1.20 and later) runs."""
IR_VERSION = 8
"""The ONNX file format version of opset 17; onnxruntime 1.20 reads it."""
MLP_LAYERS = (("dense_1", "Relu"), ("dense_2", "Relu"), ("probabilities", "Softmax"))
"""The Dense layers of ``tabular_mlp`` in order, each with its activation."""


def dense_stack_graph(
    name: str,
    layers: list[tuple[np.ndarray, np.ndarray, str]],
    *,
    input_name: str,
    output_name: str,
) -> Any:
    """An ``onnx.ModelProto`` of Dense layers: each ``(kernel, bias, activation)`` is
    ``activation(x @ kernel + bias)``, activation "Relu" or "Softmax" (over the last axis). The
    input and output have a symbolic batch dimension ``batch``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    initializers = []
    current = input_name
    for index, (kernel, bias, activation) in enumerate(layers):
        kernel_name, bias_name = f"kernel_{index}", f"bias_{index}"
        initializers += [
            numpy_helper.from_array(np.asarray(kernel, dtype=np.float32), kernel_name),
            numpy_helper.from_array(np.asarray(bias, dtype=np.float32), bias_name),
        ]
        product, summed = f"matmul_{index}", f"add_{index}"
        activated = output_name if index == len(layers) - 1 else f"{activation.lower()}_{index}"
        nodes += [
            helper.make_node("MatMul", [current, kernel_name], [product]),
            helper.make_node("Add", [product, bias_name], [summed]),
            helper.make_node(activation, [summed], [activated]),
        ]
        if activation == "Softmax":  # over the last axis, as Keras's softmax
            nodes[-1].attribute.append(helper.make_attribute("axis", -1))
        current = activated
    features = int(np.shape(layers[0][0])[0])
    classes = int(np.shape(layers[-1][0])[1])
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="udfserve")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def tabular_mlp_graph(model: keras.Model) -> Any:
    """``tabular_mlp`` (``generate_models._tabular_mlp``) as an ONNX graph with its weights; input
    ``features``, output ``probabilities``, as the Keras model names them."""
    layers = []
    for layer_name, activation in MLP_LAYERS:
        kernel, bias = model.get_layer(layer_name).get_weights()
        layers.append((kernel, bias, activation))
    return dense_stack_graph(
        f"{model.name}{ONNX_SUFFIX}", layers, input_name="features", output_name="probabilities"
    )


def save_tabular_mlp_onnx(model: keras.Model, version_dir: Path) -> None:
    """Write ``tabular_mlp``'s ONNX graph as ``version_dir/model.onnx``."""
    (Path(version_dir) / ONNX_FILE_NAME).write_bytes(tabular_mlp_graph(model).SerializeToString())
