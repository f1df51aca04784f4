"""A server SIGKILLed in the middle of a Spark job: every row is still answered exactly once, by the
server before the kill and by the CPU fallback after it, which runs the same backend in the Python
workers; the answers equal the framework's own in this process. One test, one case per backend:
TensorFlow (the example ``tabular_mlp``), ONNX Runtime (``scored/1/model.onnx``), PyTorch
(``m/1/model.pt2``) and XGBoost (the example ``tabular_xgb``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import ROWS, feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict

pytestmark = pytest.mark.slow
KILL_AT_ROW = 5_000
"""The row at which a step after the prediction kills the server: well before the job's end."""


@dataclass(frozen=True)
class Case:
    """One backend's model: where it is, the columns it takes, and its answers in this process."""

    model: str
    repository: str
    """The fixture of its repository."""
    inputs: Callable[[], list[Column]]
    """The input columns, computed from the row's id."""
    outputs: tuple[str, ...]
    """The columns of the result compared: ``p``, or ``p.<output>`` of a model of several outputs."""
    expected: Callable[[Path, np.ndarray], dict[str, np.ndarray]]
    """The framework's own answers for the rows' ids, by output column."""
    tolerance: float


def keras_answers(repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    outputs = reference_outputs(repository, "tabular_mlp", {"features": feature_values(ids, (64,))})
    return {"p": outputs["probabilities"]}


def onnxruntime_answers(repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    from onnx_graphs import SCORED_TABLE_ROWS

    session = ort.InferenceSession(
        str(repository / "scored" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = {"amount": feature_values(ids, (3,)), "code": (ids % SCORED_TABLE_ROWS).astype(np.int64)}
    return dict(zip(["score", "scaled"], session.run(["score", "scaled"], inputs), strict=True))


def torch_answers(repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    from torch_programs import conv_net_inputs, torch_outputs

    return torch_outputs(repository / "m" / "1" / "model.pt2", conv_net_inputs(ids))


def xgboost_answers(repository: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    import xgboost

    from udfserve.runtime.backends.xgboost.example import FEATURES

    booster = xgboost.Booster()
    booster.load_model(str(repository / "tabular_xgb" / "1" / "model.ubj"))
    return {"p": booster.inplace_predict(feature_values(ids, (FEATURES,)))}


def onnx_inputs() -> list[Column]:
    from onnx_graphs import SCORED_TABLE_ROWS

    return [feature_column((3,)), (F.col("id") % SCORED_TABLE_ROWS).cast("long")]  # type: ignore[list-item]


def torch_inputs() -> list[Column]:
    from torch_programs import IMAGE_SHAPE

    return [feature_column(IMAGE_SHAPE), F.col("id") % 5]  # type: ignore[list-item]


def keras_inputs() -> list[Column]:
    return [feature_column((64,))]  # type: ignore[list-item]


def xgboost_inputs() -> list[Column]:
    from udfserve.runtime.backends.xgboost.example import FEATURES

    return [feature_column((FEATURES,))]  # type: ignore[list-item]


CASES = [
    Case("tabular_mlp", "example_repository", keras_inputs, ("p",), keras_answers, 1e-5),
    Case("scored", "onnx_repository", onnx_inputs, ("p.score", "p.scaled"), onnxruntime_answers, 1e-5),
    Case("m", "torch_repository", torch_inputs, ("p.probabilities", "p.energy"), torch_answers, 1e-5),
    Case("tabular_xgb", "xgboost_repository", xgboost_inputs, ("p",), xgboost_answers, 1e-6),
]


@pytest.fixture(scope="module")
def onnx_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx_graphs import scored_graph, write_model

    root = tmp_path_factory.mktemp("onnx_only")
    write_model(root, "scored", scored_graph())
    return root


@pytest.fixture(scope="module")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torch_programs import conv_net_repository

    return conv_net_repository(tmp_path_factory.mktemp("torch-repo"))


@pytest.fixture(scope="module")
def xgboost_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from udfserve.runtime.backends.xgboost.example import write_examples

    root = tmp_path_factory.mktemp("xgboost-repo")
    write_examples(root)
    return root


@pytest.fixture
def case_repository(request: pytest.FixtureRequest) -> Path:
    case: Case = request.param
    repository: Path = request.getfixturevalue(case.repository)
    return repository


@pytest.fixture
def own_server(case_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test kills."""
    process = launch_server(
        case_repository, socket=tmp_path / "grpc.sock", port=0, http_port=0, log_path=tmp_path / "server.log"
    )
    yield process
    process.kill()


def killing_step(pid: int, metrics_url: str) -> Callable[[Iterator[object]], Iterator[object]]:
    """A ``mapInArrow`` step that SIGKILLs the server when it sees row ``KILL_AT_ROW``, recording in
    that row how many rows the server had answered by then."""
    kill_at = KILL_AT_ROW

    def kill_server_at_row(batches: Iterator[object]) -> Iterator[object]:
        import os
        import signal
        import urllib.request

        import pyarrow as pa

        for batch in batches:
            served = [None] * batch.num_rows  # type: ignore[attr-defined]
            ids = batch.column("id").to_pylist()  # type: ignore[attr-defined]
            if kill_at in ids:
                text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
                served[ids.index(kill_at)] = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("udfserve_rows_total{")
                )
                os.kill(pid, signal.SIGKILL)
            yield batch.append_column("served_before_kill", pa.array(served, pa.float64()))  # type: ignore[attr-defined]

    return kill_server_at_row


@pytest.mark.parametrize("case_repository", CASES, ids=[case.model for case in CASES], indirect=True)
def test_a_server_killed_mid_job_answers_every_row_once_equal_to_the_framework(
    spark: SparkSession,
    case_repository: Path,
    own_server: ServerProcess,
    spark_log: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The rows the server had answered when it was killed are fewer than the job's, so the rest
    can only have come from the CPU fallback."""
    case: Case = request.node.callspec.params["case_repository"]
    config = ClientConfig(
        address=own_server.grpc_target(), model_repository=str(case_repository), rows_per_request=2_000
    )
    predict = remote_predict(case.model, config=config)
    predicted: DataFrame = spark.range(ROWS, numPartitions=2).select("id", predict(*case.inputs()).alias("p"))
    schema = T.StructType([*predicted.schema.fields, T.StructField("served_before_kill", T.DoubleType())])
    step = killing_step(own_server.pid, f"http://{own_server.http_address}/metrics")

    scored = predicted.mapInArrow(step, schema)  # type: ignore[arg-type]

    result = scored.select("id", *case.outputs, "served_before_kill").toPandas()

    assert own_server.process.wait(timeout=30) == -9
    served_before_kill = result["served_before_kill"].dropna().tolist()
    assert len(served_before_kill) == 1 and 0 < served_before_kill[0] < ROWS
    ids = result["id"].to_numpy()
    assert len(ids) == ROWS and len(np.unique(ids)) == ROWS, "a row was lost or answered twice"
    ordered = result.sort_values("id")
    expected = case.expected(case_repository, ordered["id"].to_numpy())
    for column in case.outputs:
        name = column.removeprefix("p.")
        values = ordered[name]
        got = stacked(values) if values.dtype == object else values.to_numpy()
        np.testing.assert_allclose(got, expected[name], atol=case.tolerance, rtol=0, err_msg=column)
    assert re.search(
        r"the server failed mid-partition after \d+ answered batches", spark_log.read_text(errors="replace")
    )
    stats = predict.stats()
    assert stats.rows_by_server + stats.rows_by_fallback == ROWS
    assert stats.rows_by_server > 0 and stats.rows_by_fallback > 0
    assert stats.batches_by_fallback == sum(stats.fallback_reasons.values()) > 0
    assert set(stats.fallback_reasons) <= {
        "stream_error:UNAVAILABLE",
        "stream_error:CANCELLED",
        "stream_closed",
        "connect_failed",
    }, stats.fallback_reasons
