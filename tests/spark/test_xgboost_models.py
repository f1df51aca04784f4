"""A Spark job scoring the XGBoost backend's example ``tabular_xgb`` through ``remote_predict``: its
100,000 answers equal XGBoost's own ``inplace_predict`` in this process. (The same job with the
server SIGKILLed mid-way is one case of ``test_server_killed_mid_job.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xgboost
from pyspark.sql import SparkSession
from spark_data import ROWS, feature_column, feature_values

from udfserve.runtime.backends.xgboost.example import FEATURES, NAME, write_examples
from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict

pytestmark = pytest.mark.slow
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def xgboost_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("xgboost-repo")
    write_examples(root)
    return root


@pytest.fixture(scope="module")
def xgboost_server(
    xgboost_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("xgboost-server")
    process = launch_server(
        xgboost_repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )
    yield process
    process.terminate()


def xgboosts_answers(repository: Path, ids: np.ndarray) -> np.ndarray:
    """XGBoost's own answers for the rows ``ids``, computed in this process."""
    booster = xgboost.Booster()
    booster.load_model(str(repository / NAME / "1" / "model.ubj"))
    answers: np.ndarray = booster.inplace_predict(feature_values(ids, (FEATURES,)))
    return answers


def test_a_spark_jobs_predictions_equal_xgboosts_in_process(
    spark: SparkSession, xgboost_server: ServerProcess, xgboost_repository: Path
) -> None:
    """The fallback is off: every row is the server's answer."""
    predict = remote_predict(
        NAME, config=ClientConfig(address=xgboost_server.grpc_target(), fallback="error")
    )
    frame = spark.range(ROWS, numPartitions=2).select("id", predict(feature_column((FEATURES,))).alias("p"))

    result = frame.toPandas()

    ids = result["id"].to_numpy()
    assert len(ids) == ROWS and len(np.unique(ids)) == ROWS, "a row was lost or answered twice"
    ordered = result.sort_values("id")
    np.testing.assert_allclose(
        ordered["p"].to_numpy(),
        xgboosts_answers(xgboost_repository, ordered["id"].to_numpy()),
        atol=TOLERANCE,
        rtol=0,
    )
    assert predict.stats().rows_by_server == ROWS
