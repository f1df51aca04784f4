"""The models that Triton's published example clients call, as small ONNX graphs.

Triton's client repository (``src/python/examples`` of triton-inference-server/client) ships
example programs written against models of Triton's own test repository: ``simple`` (two INT32
``[-1, 16]`` inputs, their sum and difference out), ``simple_int8`` (the same in INT8),
``simple_string`` (the same with every number a BYTES string), ``simple_identity`` (BYTES in,
the same out) and ``custom_identity_int32`` (INT32 in, the same out). Served by udfserve under
those names, with those tensor names, datatypes and shapes, the clients run against udfserve
unchanged (``scripts/triton_examples.sh`` runs them; docs/kserve.md has the table).

Each model is a graph of a few ONNX operators built with ``onnx.helper``, served by ONNX Runtime:
``Add`` and ``Sub`` on int32 (INT8 is cast to int32 and back, the wrap-around of Triton's int8
model included), ``Cast`` between strings and int32 for ``simple_string``, ``Identity`` for the
identities. Written only when asked (``udfserve models generate --triton-examples``); needs the
``onnx`` package to write and the ``onnx`` extra (ONNX Runtime) to serve.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TRITON_EXAMPLES_HELP = (
    "also write the models Triton's example clients call (simple, simple_int8, simple_string, "
    "simple_identity, custom_identity_int32: small ONNX graphs with Triton's tensor names, "
    "datatypes and shapes; needs the onnx package, served with the onnx extra)"
)
"""The help of ``udfserve models generate --triton-examples``."""

ROW_ELEMENTS = 16
"""Elements per row of the two-input models: the clients send ``[1, 16]``."""
MAX_BATCH_SIZE = 8
"""Triton's example models take up to 8 rows a call; so do these."""
STRING_WARMUP = {"INPUT0": [["1"] * ROW_ELEMENTS], "INPUT1": [["1"] * ROW_ELEMENTS]}
"""``simple_string`` casts its strings to numbers, which the synthetic warm-up's empty strings are
not: a sample of numbers warms it up and checks it at load."""


def _sum_and_difference(name: str, elem_type: int, *, through: int | None = None) -> Any:
    """``OUTPUT0 = INPUT0 + INPUT1`` and ``OUTPUT1 = INPUT0 - INPUT1``, both ``[batch, 16]`` of
    ``elem_type``; ``through``: the element type the sums are computed in (cast there and back),
    for types ONNX Runtime has no ``Add`` for (int8) or that hold numbers as text (string)."""
    from onnx import helper

    nodes = []
    operands = ["INPUT0", "INPUT1"]
    if through is not None:
        nodes += [helper.make_node("Cast", [x], [f"{x}_number"], to=through) for x in operands]
        operands = [f"{x}_number" for x in operands]
    results = {"OUTPUT0": "Add", "OUTPUT1": "Sub"}
    for output, operator in results.items():
        computed = output if through is None else f"{output}_number"
        nodes.append(helper.make_node(operator, operands, [computed]))
        if through is not None:
            nodes.append(helper.make_node("Cast", [computed], [output], to=elem_type))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(x, elem_type, ["batch", ROW_ELEMENTS]) for x in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(x, elem_type, ["batch", ROW_ELEMENTS]) for x in results],
    )
    return _checked(graph)


def _identity(name: str, elem_type: int) -> Any:
    """``OUTPUT0`` is ``INPUT0``: ``[batch, elements]``, any number of elements a row."""
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem_type, ["batch", "elements"])],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, ["batch", "elements"])],
    )
    return _checked(graph)


def _checked(graph: Any) -> Any:
    import onnx
    from onnx import helper

    from udfserve.services.examples.onnx_models import IR_VERSION, OPSET

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="udfserve")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _graphs() -> dict[str, tuple[Callable[[], Any], dict[str, Any]]]:
    """name -> (graph builder, config.yaml fields besides the name)."""
    from onnx import TensorProto

    batching = {"max_batch_size": MAX_BATCH_SIZE}
    return {
        "simple": (partial(_sum_and_difference, "simple", TensorProto.INT32), batching),
        "simple_int8": (
            partial(_sum_and_difference, "simple_int8", TensorProto.INT8, through=TensorProto.INT32),
            batching,
        ),
        "simple_string": (
            partial(_sum_and_difference, "simple_string", TensorProto.STRING, through=TensorProto.INT32),
            {**batching, "warmup": {"samples": [STRING_WARMUP]}},
        ),
        "simple_identity": (partial(_identity, "simple_identity", TensorProto.STRING), batching),
        "custom_identity_int32": (partial(_identity, "custom_identity_int32", TensorProto.INT32), batching),
    }


def generate_triton_examples(root: Path, *, overwrite: bool = False) -> list[str]:
    """Write the models of Triton's example clients under ``root`` (each kept when present
    unless ``overwrite``); returns their names. Needs the onnx package (``onnx_missing``)."""
    from udfserve.services.examples.generate_models import _kept, _write_model
    from udfserve.services.examples.onnx_models import ONNX_FILE_NAME

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    graphs = _graphs()
    for name, (build, config) in graphs.items():
        if not overwrite and _kept(root / name):
            continue
        graph = build()

        def save(version_dir: Path, graph: Any = graph) -> None:
            (version_dir / ONNX_FILE_NAME).write_bytes(graph.SerializeToString())

        _write_model(root, name, config, save)
    return list(graphs)


def main(argv: Sequence[str] | None = None) -> int:
    """Write only these models (no Keras examples, no TensorFlow import)."""
    from udfserve.services.examples.generate_models import onnx_missing

    parser = argparse.ArgumentParser(
        prog="python -m udfserve.services.examples.triton_examples",
        description="Write the models Triton's example clients call, and no other: "
        + TRITON_EXAMPLES_HELP.removeprefix("also write the models Triton's example clients call "),
    )
    parser.add_argument("--output", type=Path, required=True, help="repository folder to write into")
    parser.add_argument("--overwrite", action="store_true", help="regenerate models already present")
    args = parser.parse_args(argv)
    if onnx_missing():
        parser.error(onnx_missing("these models"))
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    names = generate_triton_examples(args.output, overwrite=args.overwrite)
    logger.info("Triton's example models in %s: %s", args.output, ", ".join(names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
