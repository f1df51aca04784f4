"""A server of a repository holding the XGBoost backend's example ``tabular_xgb`` (written by the
function its registry entry names): it serves the booster with the specs read from it, over the
Arrow protocol and KServe, with the answers XGBoost's ``inplace_predict`` computes in this process,
missing values included; a matrix of the wrong width is refused naming the column."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import xgboost
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

from udfserve.runtime.backends.xgboost.example import FEATURES, NAME, write_examples
from udfserve.services.model_server.launcher import ServerProcess


@pytest.fixture(scope="module")
def xgboost_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("xgboost_only")
    write_examples(root)
    return root


@pytest.fixture(scope="module")
def xgboost_server(
    xgboost_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # calls of 64 rows and more cut per core: the parts are concurrent inplace_predict calls
    with running_server(
        xgboost_repository, socket_dir, tmp_path_factory, "xgboost", ["--cpu-parallel-min-rows", "64"]
    ) as process:
        yield process


def features_of(rows: int, seed: int) -> np.ndarray:
    """Rows in the example's range, about one value in twenty missing (NaN)."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-0.5, 0.5, size=(rows, FEATURES)).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = np.nan
    return values


def xgboosts_answer(repository: Path, features: np.ndarray) -> np.ndarray:
    """XGBoost's own answer in this process: the ground truth."""
    booster = xgboost.Booster()
    booster.load_model(str(repository / NAME / "1" / "model.ubj"))
    answer: np.ndarray = booster.inplace_predict(features)
    return answer


def test_the_model_is_described_by_its_booster(xgboost_server: ServerProcess) -> None:
    status, info = http_json(xgboost_server.http_address or "", f"/v1/models/{NAME}")

    assert status == 200 and isinstance(info, dict)
    assert info["platform"] == "xgboost_ubj" and info["state"] == "ready"
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["inputs"]] == [
        ("features", "float32", [FEATURES])
    ]
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["outputs"]] == [("probability", "float32", [])]


def test_a_server_of_a_booster_loads_no_other_framework(xgboost_server: ServerProcess) -> None:
    libraries = {
        Path(line.split()[-1]).name
        for line in Path(f"/proc/{xgboost_server.pid}/maps").read_text().splitlines()
        if line.split()[-1].startswith("/")
    }

    assert "libxgboost.so" in libraries
    assert not [name for name in libraries if "tensorflow" in name or "onnxruntime" in name]


@pytest.mark.parametrize("rows", [1, 63, 1000, 4096])
def test_arrow_answers_equal_xgboosts_own(
    xgboost_server: ServerProcess, xgboost_repository: Path, rows: int
) -> None:
    features = features_of(rows, seed=rows)

    answer = stream_predict(xgboost_server.grpc_target(), [request(NAME, batch_of({"features": features}))])[
        0
    ]

    assert answer.outputs is not None, answer.message
    np.testing.assert_array_equal(
        column_to_numpy(answer.outputs.column("probability")), xgboosts_answer(xgboost_repository, features)
    )


def test_kserve_answers_equal_xgboosts_own(xgboost_server: ServerProcess, xgboost_repository: Path) -> None:
    features = features_of(37, seed=2)
    given = triton.InferInput("features", [37, FEATURES], "FP32").set_data_from_numpy(features)

    with triton.InferenceServerClient(xgboost_server.kserve_target()) as client:
        assert client.is_model_ready(NAME)
        result = client.infer(NAME, [given])

    # a scalar per row travels as KServe's [rows, 1], as Triton gives it
    np.testing.assert_array_equal(
        result.as_numpy("probability").reshape(-1), xgboosts_answer(xgboost_repository, features)
    )


def test_a_matrix_of_the_wrong_width_is_invalid_argument_naming_the_column(
    xgboost_server: ServerProcess,
) -> None:
    narrow = features_of(3, seed=3)[:, :8]

    answer = stream_predict(xgboost_server.grpc_target(), [request(NAME, batch_of({"features": narrow}))])[0]

    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'features'" in answer.message and "32" in answer.message and "8" in answer.message


def test_metrics_carry_the_model(xgboost_server: ServerProcess) -> None:
    assert xgboost_server.http_address is not None
    before = metric_value(scrape(xgboost_server.http_address), "udfserve_rows_total", model=NAME)
    stream_predict(
        xgboost_server.grpc_target(), [request(NAME, batch_of({"features": features_of(11, seed=4)}))]
    )

    page = scrape(xgboost_server.http_address)

    assert metric_value(page, "udfserve_rows_total", model=NAME) - before == 11
    assert metric_value(page, "udfserve_model_ready", model=NAME, version="1") == 1
