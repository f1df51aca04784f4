"""Hostile requests of both protocols, as a fuzzing client sends them: valid requests of the
example models with one to three things wrong, messages that do not parse, and random bytes.

Every generator takes a ``numpy`` random generator and returns the serialized message, so a run
is reproduced by its seed. What each mutation aims at is named in ``MUTATIONS``: the statuses a
server gives them are all client errors (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
RESOURCE_EXHAUSTED, UNIMPLEMENTED), or OK when a mutation happened to leave the request valid.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from tritonclient.grpc import service_pb2 as kpb

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import encode_batch

MODELS = ("tabular_mlp", "multi_io", "text_hashing")
DATATYPES: tuple[str, ...] = (
    *("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16"),
    *("FP32", "FP64", "BYTES", "BF16", "", "INT4", "fp32", "X" * 300),
)
EXTREMES = (0, 1, -1, 16, 99, 1000, 70000, 100000, 2**31 - 1, -(2**31), 2**32, 2**63 - 1, -(2**63))
LONG_TEXT = 64 << 10
"""Length of the long names, ids and versions sent: long enough to be costly if copied around."""


def _rows(rng: np.random.Generator) -> int:
    return int(rng.choice([0, 1, 2, 3, 7, 64]))


def _inputs(model: str, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if model == "tabular_mlp":
        return {"features": rng.normal(size=(rows, 64)).astype(np.float32)}
    if model == "multi_io":
        return {
            "numeric": rng.normal(size=(rows, 8)).astype(np.float32),
            "category": rng.integers(0, 16, size=rows).astype(np.int32),
        }
    return {"text": np.array([f"word {i}".encode() for i in range(rows)], dtype=object)}


def _text(rng: np.random.Generator) -> str:
    choice = int(rng.integers(0, 6))
    return ["", "../etc/passwd", "no_such_model", "x" * LONG_TEXT, "\x00\n\t", "9" * 5000][choice]


def _flip(data: bytes, rng: np.random.Generator) -> bytes:
    if not data:
        return bytes(rng.integers(0, 256, size=8, dtype=np.uint8))
    mutable = bytearray(data)
    for _ in range(int(rng.integers(1, 8))):
        mutable[int(rng.integers(0, len(mutable)))] = int(rng.integers(0, 256))
    return bytes(mutable)


def _random_bytes(rng: np.random.Generator) -> bytes:
    return bytes(rng.integers(0, 256, size=int(rng.integers(1, 512)), dtype=np.uint8))


UNPARSEABLE = b"\x0a\x05ab"
"""Field 1 declares 5 bytes and 2 follow: no message parses from it."""


# -- KServe ModelInferRequest ------------------------------------------------------------------------
def _kserve_valid(rng: np.random.Generator) -> kpb.ModelInferRequest:
    model = str(rng.choice(MODELS))
    rows = _rows(rng)
    message = kpb.ModelInferRequest(model_name=model, id=f"fuzz-{int(rng.integers(0, 1 << 30))}")
    for name, array in _inputs(model, rows, rng).items():
        datatype = (
            "BYTES" if array.dtype == object else {"float32": "FP32", "int32": "INT32"}[array.dtype.name]
        )
        shape = [rows, *array.shape[1:]] if array.ndim > 1 else [rows]
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        if datatype == "BYTES":
            raw = b"".join(len(v).to_bytes(4, "little") + v for v in array.reshape(-1))
        else:
            raw = array.tobytes()
        message.raw_input_contents.append(raw)
    return message


def _k_datatype(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    if m.inputs:
        m.inputs[int(rng.integers(0, len(m.inputs)))].datatype = str(rng.choice(DATATYPES))


def _k_shape(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    if m.inputs:
        tensor = m.inputs[int(rng.integers(0, len(m.inputs)))]
        del tensor.shape[:]
        tensor.shape.extend(int(rng.choice(EXTREMES)) for _ in range(int(rng.integers(0, 6))))


def _k_raw(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    if m.raw_input_contents:
        index = int(rng.integers(0, len(m.raw_input_contents)))
        m.raw_input_contents[index] = _flip(m.raw_input_contents[index], rng)[: int(rng.integers(0, 600))]


def _k_typed(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    """Typed contents of a narrow datatype holding values beyond it (INT8 1000, UINT16 70000)."""
    del m.raw_input_contents[:]
    for tensor in m.inputs:
        count = int(np.prod(tensor.shape)) if len(tensor.shape) else 0
        tensor.datatype = str(rng.choice(["INT8", "UINT8", "INT16", "UINT16", "INT32", "FP32"]))
        values = [int(rng.choice(EXTREMES[:9])) for _ in range(min(count, 4096))]
        if tensor.datatype == "FP32":
            tensor.contents.fp32_contents.extend(float(v) for v in values)
        elif tensor.datatype.startswith("UINT"):
            tensor.contents.uint_contents.extend(v for v in values if 0 <= v < 2**32)
        else:
            tensor.contents.int_contents.extend(v for v in values if -(2**31) <= v < 2**31)


def _k_ids(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    """Embedding ids beyond multi_io's table of 16."""
    for index, tensor in enumerate(m.inputs):
        if tensor.name == "category" and index < len(m.raw_input_contents):
            count = len(m.raw_input_contents[index]) // 4
            ids = rng.integers(-(2**31), 2**31 - 1, size=count, dtype=np.int64).astype(np.int32)
            m.raw_input_contents[index] = ids.tobytes()


def _k_names(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    which = int(rng.integers(0, 4))
    if which == 0:
        m.model_name = _text(rng)
    elif which == 1:
        m.model_version = _text(rng)
    elif which == 2:
        m.id = _text(rng)
    elif m.inputs:
        m.inputs[int(rng.integers(0, len(m.inputs)))].name = _text(rng)


def _k_structure(m: kpb.ModelInferRequest, rng: np.random.Generator) -> None:
    which = int(rng.integers(0, 5))
    if which == 0 and m.inputs:
        del m.inputs[0]
    elif which == 1 and m.inputs:
        m.inputs.add().CopyFrom(m.inputs[0])
    elif which == 2:
        m.outputs.add(name=_text(rng))
    elif which == 3:
        output = m.outputs.add(name="probabilities")
        output.parameters["shared_memory_region"].string_param = "region"
    else:
        m.raw_input_contents.append(_random_bytes(rng))


MUTATIONS: dict[str, Callable[[kpb.ModelInferRequest, np.random.Generator], None]] = {
    "datatype": _k_datatype,
    "shape": _k_shape,
    "raw contents": _k_raw,
    "typed contents out of range": _k_typed,
    "embedding ids out of range": _k_ids,
    "names, versions, ids": _k_names,
    "inputs and outputs": _k_structure,
}


def kserve_request(rng: np.random.Generator) -> bytes:
    """One hostile ``ModelInferRequest``, serialized (or bytes that parse as none)."""
    roll = rng.random()
    if roll < 0.04:
        return UNPARSEABLE
    if roll < 0.08:
        return _random_bytes(rng)
    message = _kserve_valid(rng)
    names = list(MUTATIONS)
    for name in rng.choice(names, size=int(rng.integers(1, 4))):
        MUTATIONS[str(name)](message, rng)
    data = message.SerializeToString()
    return _flip(data, rng) if roll < 0.15 else data


def kserve_metadata_call(rng: np.random.Generator) -> tuple[str, bytes]:
    """One hostile metadata, readiness, configuration or statistics call: (method, message)."""
    name, version = (_text(rng) if rng.random() < 0.7 else str(rng.choice(MODELS))), _text(rng)
    method = str(rng.choice(["ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"]))
    message = {
        "ModelReady": kpb.ModelReadyRequest,
        "ModelMetadata": kpb.ModelMetadataRequest,
        "ModelConfig": kpb.ModelConfigRequest,
        "ModelStatistics": kpb.ModelStatisticsRequest,
    }[method](name=name, version=version)
    return method, UNPARSEABLE if rng.random() < 0.1 else message.SerializeToString()


# -- Arrow PredictRequest ----------------------------------------------------------------------------
def _column(array: np.ndarray) -> pa.Array:
    if array.dtype == object:
        return pa.array(list(array), pa.binary())
    flat = pa.array(array.reshape(-1))
    for size in reversed(array.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def _arrow_columns(model: str, rows: int, rng: np.random.Generator) -> dict[str, pa.Array]:
    columns = {name: _column(array) for name, array in _inputs(model, rows, rng).items()}
    which = int(rng.integers(0, 7))
    name = next(iter(columns))
    if which == 0:
        columns[f"{name}_renamed"] = columns.pop(name)
    elif which == 1:
        columns[name] = pa.array([str(v) for v in range(rows)])
    elif which == 2 and rows:
        columns[name] = pa.array([None] * rows, pa.list_(pa.float32()))
    elif which == 3 and rows:
        columns[name] = pa.array(
            [[1.0] * int(rng.integers(0, 70)) for _ in range(rows)], pa.list_(pa.float32())
        )
    elif which == 4 and "category" in columns:
        ids = rng.integers(-(2**31), 2**31 - 1, size=rows, dtype=np.int64).astype(np.int32)
        columns["category"] = pa.array(ids)
    elif which == 5:
        columns["extra"] = pa.array(np.zeros(rows, np.float64))
    return columns


def arrow_request(rng: np.random.Generator, batch_id: int) -> bytes:
    """One hostile ``PredictRequest`` of a stream, serialized."""
    model = str(rng.choice(MODELS))
    payload = encode_batch(pa.record_batch(_arrow_columns(model, _rows(rng), rng)))
    message = pb.PredictRequest(model=model, batch_id=batch_id, arrow_ipc=payload)
    which = int(rng.integers(0, 8))
    if which == 0:
        message.arrow_ipc = _flip(payload, rng)
    elif which == 1:
        message.arrow_ipc = payload[: int(rng.integers(0, len(payload) + 1))]
    elif which == 2:
        message.arrow_ipc = _random_bytes(rng)
    elif which == 3:
        message.model = _text(rng)
    elif which == 4:
        message.version = int(rng.integers(-(2**63), 2**63 - 1))
    elif which == 5:
        message.ClearField("arrow_ipc")
        message.input_region.path = _text(rng)[:200]
        message.input_region.offset = int(rng.integers(0, 1 << 40))
        message.input_region.size = int(rng.integers(0, 1 << 40))
    return message.SerializeToString()
