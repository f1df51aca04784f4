"""The null models of ``benchmarks.null_model``: ONNX graphs that do no arithmetic, their model
repository, and the parquet files they are scored on.

A null model leaves only the serving path to measure: Spark's hand-off to its Python workers,
Arrow, the transport and the server's decode, batching and encode. ``null_slice`` returns the first
8 of 64 float32 columns (a model's usual shape: a few outputs of a wider input); ``null_wide`` returns
all 1,024 of its columns, where the bytes moved dominate. Both are one ONNX ``Slice``, written
with ``onnx.helper`` as the example ONNX model is (``udfserve.services.examples.onnx_models``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from udfserve.services.examples.onnx_models import IR_VERSION, ONNX_FILE_NAME, OPSET

INPUT = "features"
OUTPUT = "prediction"


@dataclass(frozen=True)
class NullModel:
    """A model returning the first ``kept`` of its ``width`` float32 input columns."""

    name: str
    width: int
    kept: int

    @property
    def input_bytes_per_row(self) -> int:
        return 4 * self.width

    @property
    def output_bytes_per_row(self) -> int:
        return 4 * self.kept


NULL_MODELS = {
    "null_slice": NullModel("null_slice", 64, 8),
    "null_wide": NullModel("null_wide", 1024, 1024),
}


def slice_graph(model: NullModel) -> Any:
    """``prediction = features[:, :kept]``: one ``Slice`` on the column axis; the row dimension is
    the symbol ``batch``, so the server batches any number of rows."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bounds = {
        "starts": [0],
        "ends": [model.kept],
        "axes": [1],
    }
    graph = helper.make_graph(
        [helper.make_node("Slice", [INPUT, *bounds], [OUTPUT])],
        model.name,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", model.width])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", model.kept])],
        initializer=[numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in bounds.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="udfserve")
    proto.ir_version = IR_VERSION
    onnx.checker.check_model(proto, full_check=True)
    return proto


def write_repository(root: Path, max_batch_size: int) -> Path:
    """A model repository of every null model, each served up to ``max_batch_size`` rows a call
    with the example models' 2 ms queue delay; ``root``, once written."""
    for model in NULL_MODELS.values():
        version = root / model.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / ONNX_FILE_NAME).write_bytes(slice_graph(model).SerializeToString())
        config = {
            "name": model.name,
            "max_batch_size": max_batch_size,
            "dynamic_batching": {"max_queue_delay_s": 0.002},
        }
        (root / model.name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def write_dataset(path: Path, model: NullModel, rows: int, files: int, row_group_rows: int) -> None:
    """``rows`` rows of an ``id`` and ``features`` (a flat ``array<float>`` of the model's width)
    in ``files`` parquet files of ``row_group_rows``-row groups."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(40)
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        count = min(per_file, rows - start)
        values = rng.standard_normal(count * model.width, dtype=np.float32)
        offsets = np.arange(0, count * model.width + 1, model.width, dtype=np.int32)
        table = pa.table(
            {
                "id": pa.array(np.arange(start, start + count, dtype=np.int64)),
                INPUT: pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        pq.write_table(table, path / f"part-{index:03d}.parquet", row_group_size=row_group_rows)
