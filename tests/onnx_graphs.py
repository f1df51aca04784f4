"""Small ONNX graphs built with ``onnx.helper`` for the ONNX Runtime tests: models the examples
never use, and the files a server must refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
SCORED_TABLE_ROWS = 10
"""``scored_graph``'s ``code`` input indexes a table of this many rows: 0..9."""


def model_of(graph: Any, *, domains: tuple[str, ...] = ()) -> ModelProto:
    opsets = [helper.make_opsetid("", OPSET), *(helper.make_opsetid(domain, 1) for domain in domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="udfserve-tests")
    model.ir_version = IR_VERSION
    return model


def scored_graph() -> ModelProto:
    """Two inputs of different dtypes and ranks, two outputs: ``amount`` float32 (batch, 3) and
    ``code`` int64 (batch,) give ``score`` float32 (batch,) = amount . weights + table[code], and
    ``scaled`` float64 (batch, 3) = amount x 2 as doubles. The batch dimension is the symbol
    ``rows`` on the inputs, unknown on the outputs."""
    rng = np.random.default_rng(26)
    weights = rng.standard_normal((3, 1)).astype(np.float32)
    table = rng.standard_normal((SCORED_TABLE_ROWS,)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["amount", "weights"], ["weighted"]),
        helper.make_node("Squeeze", ["weighted", "last_axis"], ["weighted_row"]),
        helper.make_node("Gather", ["table", "code"], ["offset"]),
        helper.make_node("Add", ["weighted_row", "offset"], ["score"]),
        helper.make_node("Cast", ["amount"], ["amount_double"], to=TensorProto.DOUBLE),
        helper.make_node("Mul", ["amount_double", "two"], ["scaled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scored",
        [
            helper.make_tensor_value_info("amount", TensorProto.FLOAT, ["rows", 3]),
            helper.make_tensor_value_info("code", TensorProto.INT64, ["rows"]),
        ],
        [
            helper.make_tensor_value_info("score", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("scaled", TensorProto.DOUBLE, [None, 3]),
        ],
        initializer=[
            numpy_helper.from_array(weights, "weights"),
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "last_axis"),
            numpy_helper.from_array(np.array(2.0, dtype=np.float64), "two"),
        ],
    )
    return model_of(graph)


def scored_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "amount": rng.standard_normal((rows, 3)).astype(np.float32),
        "code": rng.integers(0, SCORED_TABLE_ROWS, size=rows).astype(np.int64),
    }


def identity_graph(
    elem_type: int = TensorProto.FLOAT, shape: list[Any] | None = None, *, name: str = "x"
) -> ModelProto:
    """One input passed through; ``shape`` None: ``["batch", 4]``."""
    dims = ["batch", 4] if shape is None else shape
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], ["y"])],
        "identity",
        [helper.make_tensor_value_info(name, elem_type, dims)],
        [helper.make_tensor_value_info("y", elem_type, dims)],
    )
    return model_of(graph)


def text_graph() -> ModelProto:
    """A string input ``text`` (batch,) and its copy ``same`` out."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "text",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch"])],
    )
    return model_of(graph)


def casting_graph() -> ModelProto:
    """A string input ``text`` (batch, 1) cast to float ``value`` (batch, 1): ``"1.5"`` is 1.5, and
    a string that is no number (the empty string included) fails the call."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["text"], ["value"], to=TensorProto.FLOAT)],
        "casting",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", 1])],
    )
    return model_of(graph)


def custom_op_graph() -> ModelProto:
    """A graph whose one node is an operator of a custom domain, which no library registers."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.custom")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return model_of(graph, domains=("com.example.custom",))


def allocating_graph() -> ModelProto:
    """``n`` int64 (batch,) in, ``y`` = n as float32 out; on the way, a float buffer of max(n)
    elements is allocated (and its sum multiplied by zero): a large ``n`` is a request whose
    call cannot get its memory."""
    nodes = [
        helper.make_node("ReduceMax", ["n"], ["largest"], keepdims=1),
        helper.make_node(
            "ConstantOfShape",
            ["largest"],
            ["buffer"],
            value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("ReduceSum", ["buffer"], ["total"], keepdims=1),
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
        helper.make_node("Cast", ["n"], ["n_float"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["n_float", "nothing"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "allocating",
        [helper.make_tensor_value_info("n", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        initializer=[numpy_helper.from_array(np.zeros(1, dtype=np.float32), "zero")],
    )
    return model_of(graph)


def looping_graph() -> ModelProto:
    """``steps`` int64 (batch, 1) in, ``y`` = steps + max(steps) as float32 out, counted by a ``Loop``
    of max(steps) iterations: a large ``steps`` is a call that runs for as long as its input says
    (10**12 iterations: hours)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["going_in"], ["going_out"]),
            helper.make_node("Add", ["count_in", "one"], ["count_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("going_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("count_in", TensorProto.FLOAT, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("going_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("count_out", TensorProto.FLOAT, ["batch", 1]),
        ],
        initializer=[numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["steps"], ["trips"], keepdims=0),
            helper.make_node("Cast", ["steps"], ["start"], to=TensorProto.FLOAT),
            helper.make_node("Loop", ["trips", "going", "start"], ["y"], body=body),
        ],
        "looping",
        [helper.make_tensor_value_info("steps", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[numpy_helper.from_array(np.array(True), "going")],
    )
    return model_of(graph)


def weighty_graph(table_rows: int, seed: int = 0) -> ModelProto:
    """``index`` int64 (batch,) in, ``row`` float32 (batch, 4) out: rows of a random table of
    ``table_rows`` x 4 floats held in the graph (16 bytes a row), which no optimisation can fold
    away: a model whose weights are as large as asked."""
    table = np.random.default_rng(seed).standard_normal((table_rows, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "index"], ["row"])],
        "weighty",
        [helper.make_tensor_value_info("index", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("row", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    return model_of(graph)


def write_model(root: Path, name: str, model: ModelProto | bytes, *, config: str | None = None) -> Path:
    """``root/name/1/model.onnx`` (and ``root/name/config.yaml`` when given); returns the file."""
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    if config is not None:
        (root / name / "config.yaml").write_text(config, encoding="utf-8")
    return path


def doubled_sum_graph(features: int = 4) -> ModelProto:
    """``features`` float32 (batch, ``features``) in, ``doubled_sum`` = 2 x the row's sum out: the
    numbers of ``tests/spark/slow_model.py``'s model, computed at once and without TensorFlow."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["features", "rows_axis"], ["total"], keepdims=0),
            helper.make_node("Mul", ["total", "two"], ["doubled_sum"]),
        ],
        "doubled_sum",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("doubled_sum", TensorProto.FLOAT, ["batch"])],
        initializer=[
            numpy_helper.from_array(np.array([1], dtype=np.int64), "rows_axis"),
            numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        ],
    )
    return model_of(graph)
