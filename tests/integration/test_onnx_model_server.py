"""A server of a repository holding nothing but ``scored/1/model.onnx`` (a graph the examples never
use, with two inputs of different dtypes, and no config.yaml): it serves the graph with the specs
read from it, over the Arrow protocol, KServe and shared memory, with the answers ONNX Runtime
computes in this process, and its metrics carry the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pytest
import tritonclient.grpc as triton
from onnx_graphs import SCORED_TABLE_ROWS, allocating_graph, scored_graph, scored_inputs, write_model
from server_harness import (
    batch_of,
    column_to_numpy,
    http_json,
    metric_value,
    request,
    running_server,
    scrape,
    stream_predict,
)

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.wire.arrow_wire import arrow_stream
from udfserve.spark_client.wire.channels import connect
from udfserve.spark_client.wire.transport import HeldBatch

MODEL = "scored"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def onnx_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx_only")
    write_model(root, MODEL, scored_graph())
    assert sorted(str(path.relative_to(root)) for path in root.rglob("*")) == [
        "scored",
        "scored/1",
        "scored/1/model.onnx",
    ]
    return root


@pytest.fixture(scope="module")
def onnx_server(
    onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(onnx_repository, socket_dir, tmp_path_factory, "onnx-only") as process:
        yield process


def onnxruntime_answer(repository: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX Runtime's own answer in this process: the ground truth."""
    session = ort.InferenceSession(
        str(repository / MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return dict(zip(["score", "scaled"], session.run(["score", "scaled"], inputs), strict=True))


def assert_answers(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for name, values in expected.items():
        np.testing.assert_allclose(got[name].reshape(values.shape), values, atol=TOLERANCE, rtol=0)


def test_the_model_is_described_by_its_graph(onnx_server: ServerProcess) -> None:
    status, info = http_json(onnx_server.http_address or "", f"/v1/models/{MODEL}")

    assert status == 200 and isinstance(info, dict)
    assert info["platform"] == "onnxruntime_onnx" and info["state"] == "ready"
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["inputs"]] == [
        ("amount", "float32", [3]),
        ("code", "int64", []),
    ]
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["outputs"]] == [
        ("score", "float32", []),
        ("scaled", "float64", [3]),
    ]


def test_a_server_of_onnx_models_only_never_loads_tensorflow(onnx_server: ServerProcess) -> None:
    """Backends are imported by the models that need them: the process maps ONNX Runtime's
    library and none of TensorFlow's."""
    libraries = {
        Path(line.split()[-1]).name
        for line in Path(f"/proc/{onnx_server.pid}/maps").read_text().splitlines()
        if line.split()[-1].startswith("/")
    }

    assert any("onnxruntime" in name for name in libraries)
    assert not [name for name in libraries if "tensorflow" in name]


def test_arrow_answers_equal_onnxruntimes_own(onnx_server: ServerProcess, onnx_repository: Path) -> None:
    inputs = scored_inputs(1000, seed=1)

    answer = stream_predict(onnx_server.grpc_target(), [request(MODEL, batch_of(inputs))])[0]

    assert answer.outputs is not None, answer.message
    got = {name: column_to_numpy(answer.outputs.column(name)) for name in answer.outputs.schema.names}
    assert_answers(got, onnxruntime_answer(onnx_repository, inputs))


def test_kserve_answers_equal_onnxruntimes_own(onnx_server: ServerProcess, onnx_repository: Path) -> None:
    inputs = scored_inputs(37, seed=2)
    amount = triton.InferInput("amount", [37, 3], "FP32").set_data_from_numpy(inputs["amount"])
    code = triton.InferInput("code", [37], "INT64").set_data_from_numpy(inputs["code"])

    with triton.InferenceServerClient(onnx_server.kserve_target()) as client:
        assert client.is_model_ready(MODEL)
        result = client.infer(MODEL, [amount, code])

    got = {name: result.as_numpy(name) for name in ("score", "scaled")}
    assert_answers(got, onnxruntime_answer(onnx_repository, inputs))


def test_answers_through_shared_memory_equal_onnxruntimes_own(
    onnx_server: ServerProcess, onnx_repository: Path
) -> None:
    assert onnx_server.http_address is not None
    target = f"unix://{onnx_server.unix_socket}"
    inputs = [scored_inputs(500, seed=seed) for seed in range(6)]
    read_before = metric_value(scrape(onnx_server.http_address), "udfserve_shared_memory_requests_total")
    config = ClientConfig(max_in_flight=3)
    channel, _ = connect(target, config, MODEL)
    stream = arrow_stream(channel, target, MODEL, config)

    answers: list[pa.RecordBatch] = [
        held.result for held in stream.run(HeldBatch(batch_of(i)) for i in inputs)
    ]

    read = (
        metric_value(scrape(onnx_server.http_address), "udfserve_shared_memory_requests_total") - read_before
    )
    assert read == len(inputs) and stream.counters.resent == 0
    for batch, sent in zip(answers, inputs, strict=True):
        got = {name: column_to_numpy(batch.column(name)) for name in batch.schema.names}
        assert_answers(got, onnxruntime_answer(onnx_repository, sent))


def test_a_code_beyond_the_table_is_invalid_argument_naming_the_model(onnx_server: ServerProcess) -> None:
    inputs = scored_inputs(3)
    inputs["code"][1] = SCORED_TABLE_ROWS + 5

    answer = stream_predict(onnx_server.grpc_target(), [request(MODEL, batch_of(inputs))])[0]

    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"model {MODEL!r}" in answer.message and "out of data bounds" in answer.message


def test_metrics_carry_the_model(onnx_server: ServerProcess) -> None:
    assert onnx_server.http_address is not None
    before = metric_value(scrape(onnx_server.http_address), "udfserve_rows_total", model=MODEL)
    stream_predict(onnx_server.grpc_target(), [request(MODEL, batch_of(scored_inputs(11)))])

    page = scrape(onnx_server.http_address)

    assert metric_value(page, "udfserve_rows_total", model=MODEL) - before == 11
    assert metric_value(page, "udfserve_requests_total", model=MODEL, code="OK") >= 1
    assert metric_value(page, "udfserve_model_ready", model=MODEL, version="1") == 1


RANGED_CONFIG = """\
inputs:
  - {name: amount, dtype: float32, shape: [3]}
  - {name: code, dtype: int64, shape: [], range: [0, 9]}
"""


@pytest.fixture(scope="module")
def ranged_server(socket_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("onnx_ranged")
    write_model(root, MODEL, scored_graph(), config=RANGED_CONFIG)
    with running_server(root, socket_dir, tmp_path_factory, "onnx-ranged") as process:
        yield process


def test_a_range_declared_in_config_refuses_an_id_before_the_graph_sees_it(
    ranged_server: ServerProcess,
) -> None:
    good = scored_inputs(4, seed=3)
    bad = scored_inputs(4, seed=4)
    bad["code"][2] = SCORED_TABLE_ROWS

    answers = stream_predict(
        ranged_server.grpc_target(),
        [request(MODEL, batch_of(good), batch_id=0), request(MODEL, batch_of(bad), batch_id=1)],
    )

    assert answers[0].code == grpc.StatusCode.OK
    assert answers[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'code'" in answers[1].message and "[0, 9]" in answers[1].message
    assert "Gather" not in answers[1].message


@pytest.fixture(scope="module")
def cutting_server(
    onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        onnx_repository, socket_dir, tmp_path_factory, "onnx-cut", ["--cpu-parallel-min-rows", "64"]
    ) as process:
        yield process


@pytest.mark.parametrize("rows", [127, 1000, 5001])
def test_calls_cut_per_core_answer_what_onnxruntime_computes(
    cutting_server: ServerProcess, onnx_repository: Path, rows: int
) -> None:
    """The parts of a cut call run as concurrent calls of one session."""
    inputs = scored_inputs(rows, seed=rows)

    answer = stream_predict(cutting_server.grpc_target(), [request(MODEL, batch_of(inputs))])[0]

    assert answer.outputs is not None, answer.message
    got = {name: column_to_numpy(answer.outputs.column(name)) for name in answer.outputs.schema.names}
    assert_answers(got, onnxruntime_answer(onnx_repository, inputs))


@pytest.fixture(scope="module")
def allocating_server(socket_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("onnx_allocating")
    write_model(root, "allocating", allocating_graph())
    with running_server(root, socket_dir, tmp_path_factory, "onnx-allocating") as process:
        yield process


def test_a_row_whose_memory_cannot_be_allocated_fails_only_its_request_as_resource_exhausted(
    allocating_server: ServerProcess,
) -> None:
    """ONNX Runtime's failed allocation is the out-of-memory the batcher splits on: a call holding
    the row that cannot fit is split until that row runs alone, so only its request fails, whether
    or not the batcher merged the two requests."""
    fits = {"n": np.array([1, 2, 3], dtype=np.int64)}
    too_big = {"n": np.array([4, 10**13], dtype=np.int64)}

    answers = stream_predict(
        allocating_server.grpc_target(),
        [
            request("allocating", batch_of(fits), batch_id=0),
            request("allocating", batch_of(too_big), batch_id=1),
        ],
    )

    assert answers[0].code == grpc.StatusCode.OK and answers[0].outputs is not None
    np.testing.assert_array_equal(column_to_numpy(answers[0].outputs.column("y")), [1.0, 2.0, 3.0])
    assert answers[1].code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "model 'allocating'" in answers[1].message and "out of memory" in answers[1].message
