"""A sample of hostile payloads sent to a real server, interleaved with good batches on one stream:
every one is answered, none INTERNAL, the good ones correctly, and the server keeps serving.

The payloads are those of ``tests/unit/test_hostile_input.py`` (where hypothesis explores them in
process), drawn here from a seeded generator so that the sample is the same on every run.
"""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import batch_of, metric_value, module_server, request, scrape, stream_predict

from udfserve.protocol.arrow_ipc import encode_batch
from udfserve.services.model_server.launcher import ServerProcess

ABSURD = (-1, (1 << 31) - 1, 1 << 40, 1 << 62)
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}

own_server = module_server("hostile", repository="tabular_onnx_repository", port=0, http_port=0)
"""A server of this module's own, not the shared one: its last test reads the server's count of
INTERNAL answers whole (none since the start), which only these payloads may have moved."""


def features(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, 64)).astype(np.float32)


def with_options(batch: pa.RecordBatch, options: pa.ipc.IpcWriteOptions) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def two_batches(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def odd_schemas() -> dict[str, pa.RecordBatch]:
    deep: pa.Array = pa.array([1.0, 2.0])
    for _ in range(6):
        deep = pa.ListArray.from_arrays(pa.array([0, len(deep)], pa.int32()), deep)
    return {
        "struct": pa.record_batch({"features": pa.array([{"a": 1.0, "b": 2}])}),
        "map": pa.record_batch({"features": pa.array([[("k", 1.0)]], pa.map_(pa.string(), pa.float64()))}),
        "dictionary": pa.record_batch({"features": pa.array(["a", "b"]).dictionary_encode()}),
        "string": pa.record_batch({"features": pa.array(["1.0", "2.0"])}),
        "huge string": pa.record_batch({"features": pa.array(["x" * (1 << 20)], pa.large_string())}),
        "deep nesting": pa.record_batch({"features": deep}),
        "null column": pa.record_batch({"features": pa.nulls(3)}),
        "union": pa.record_batch(
            {
                "features": pa.UnionArray.from_sparse(
                    pa.array([0, 1], pa.int8()), [pa.array([1.0, 2.0]), pa.array([3, 4])]
                )
            }
        ),
        "list view": pa.record_batch({"features": pa.array([[1.0] * 64], pa.list_view(pa.float32()))}),
        "decimal": pa.record_batch({"features": pa.array([1, 2], pa.decimal128(10, 2))}),
        "timestamp": pa.record_batch({"features": pa.array([1, 2], pa.timestamp("ns", tz="UTC"))}),
        "no columns": pa.RecordBatch.from_arrays([], schema=pa.schema([])),
        "duplicate columns": pa.RecordBatch.from_arrays(
            [pa.array([1.0]), pa.array([1.0])], names=["features", "features"]
        ),
        "zero-width rows": pa.record_batch({"features": pa.array([[]] * 3, pa.list_(pa.float32(), 0))}),
    }


def hostile_payloads(seed: int = 7) -> dict[str, bytes]:
    """Named hostile payloads meant for model ``tabular_mlp`` (input ``features``: 64 float32)."""
    rng = np.random.default_rng(seed)
    valid_batch = batch_of({"features": features(4)})
    valid = encode_batch(valid_batch)
    payloads: dict[str, bytes] = {}
    for i in range(10):
        payloads[f"random bytes {i}"] = rng.bytes(int(rng.integers(1, 4096)))
    payloads["continuation with an absurd metadata length"] = b"\xff\xff\xff\xff\xff\xff\xff\x7f" + rng.bytes(
        64
    )
    for cut in np.linspace(1, len(valid) - 9, 10).astype(int):
        payloads[f"truncated at {cut}"] = valid[:cut]
    for i in range(20):
        flipped = bytearray(valid)
        for bit in rng.integers(0, 8 * len(valid), size=int(rng.integers(1, 8))):
            flipped[bit // 8] ^= 1 << (bit % 8)
        payloads[f"bit flips {i}"] = bytes(flipped)
    for position in np.linspace(0, len(valid) - 8, 24).astype(int):
        value = int(ABSURD[position % len(ABSURD)])
        forged = bytearray(valid)
        struct.pack_into("<q", forged, int(position), value)
        payloads[f"length {value} at byte {position}"] = bytes(forged)
    payloads["zstd body"] = with_options(valid_batch, pa.ipc.IpcWriteOptions(compression="zstd"))
    payloads["lz4 body"] = with_options(valid_batch, pa.ipc.IpcWriteOptions(compression="lz4"))
    uncompressed_bytes = struct.pack("<q", 4 * 64 * 4)
    payloads["decompression bomb"] = payloads["zstd body"].replace(
        uncompressed_bytes, struct.pack("<q", 1 << 40)
    )
    zero_width = encode_batch(odd_schemas()["zero-width rows"])
    payloads["zero-width rows declaring 2**62 rows"] = zero_width.replace(
        struct.pack("<q", 3), struct.pack("<q", 1 << 62)
    )
    payloads["column name not UTF-8"] = valid.replace(b"features", b"\xff\xfeatures")
    payloads["two batches"] = two_batches(valid_batch)
    for name, batch in odd_schemas().items():
        payloads[name] = encode_batch(batch)
    return payloads


@pytest.fixture(scope="module")
def hostile_answers(own_server: ServerProcess) -> tuple[dict[int, str], dict[int, np.ndarray], dict]:
    """One stream: each hostile payload followed by a good batch, 160-odd requests."""
    hostile = hostile_payloads()
    labels: dict[int, str] = {}
    good: dict[int, np.ndarray] = {}
    requests = []
    for index, (label, payload) in enumerate(hostile.items()):
        labels[2 * index] = label
        requests.append(request("tabular_mlp", payload, batch_id=2 * index))
        good[2 * index + 1] = features(3 + index % 5, seed=index)
        requests.append(
            request("tabular_mlp", batch_of({"features": good[2 * index + 1]}), batch_id=2 * index + 1)
        )
    return labels, good, stream_predict(own_server.grpc_target(), requests)


def test_every_hostile_payload_is_answered_and_none_internal(hostile_answers) -> None:
    labels, _, answers = hostile_answers
    codes = {labels[batch_id]: answers[batch_id].code for batch_id in labels}
    unexpected = {
        label: (code.name, answers[i].message[:200])
        for i, label in labels.items()
        if (code := codes[label]) not in ALLOWED
    }
    assert unexpected == {}
    # Bit flips and forged lengths may land in the values and leave a valid batch; these may not.
    broken = [label for label in labels.values() if not label.startswith(("bit flips", "length "))]
    assert {label: codes[label].name for label in broken} == {label: "INVALID_ARGUMENT" for label in broken}


def test_good_batches_between_hostile_ones_are_answered_correctly(hostile_answers) -> None:
    _, good, answers = hostile_answers
    for batch_id, x in good.items():
        answer = answers[batch_id]
        assert answer.code == grpc.StatusCode.OK, answer.message
        assert answer.outputs is not None and answer.outputs.num_rows == len(x)


def test_the_server_keeps_serving_and_counted_no_internal_error(
    hostile_answers, own_server: ServerProcess
) -> None:
    assert hostile_answers
    assert own_server.process.poll() is None
    answer = stream_predict(
        own_server.grpc_target(), [request("tabular_mlp", batch_of({"features": features(2)}))]
    )[0]
    assert answer.code == grpc.StatusCode.OK
    assert (
        metric_value(scrape(own_server.http_address or ""), "udfserve_requests_total", code="INTERNAL") == 0
    )
