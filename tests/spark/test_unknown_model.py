"""A misspelled model name: the server answers NOT_FOUND, and the job fails with ``ModelNotFound``
naming the model and listing the server's models, over either protocol and for every UDF, in
the driver and in a task alike. Never the CPU fallback: it reads the same repository, and the
fallback is set up here (``fallback="cpu"`` with a repository) so that taking it would show."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from spark_data import feature_values

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict
from udfserve.spark_client.common.errors import ModelNotFound, RequestRejected
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.protocols import describe_model

MISSPELLED = "tabular_mpl"
SERVED = "multi_io, sequence_bilstm, tabular_mlp, tabular_mlp_savedmodel, text_hashing"


def config(server: ServerProcess, protocol: str, example_repository: Path) -> ClientConfig:
    return ClientConfig.model_validate(
        {
            "address": server.grpc_target(),
            "protocol": protocol,
            "fallback": "cpu",
            "model_repository": str(example_repository),
        }
    )


def assert_names_the_model_and_the_servers_models(error: ModelNotFound, server: ServerProcess) -> None:
    assert isinstance(error, RequestRejected) and error.code == "NOT_FOUND"
    message = str(error)
    assert message.startswith(f"model {MISSPELLED!r} does not exist on the server at {server.grpc_target()}")
    assert f"available models: {SERVED}" in message


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
@pytest.mark.parametrize("udf", ["remote_predict pandas", "remote_predict arrow", "predict_arrow"])
def test_a_misspelled_model_fails_in_the_driver_listing_the_servers_models(
    spark: SparkSession, server: ServerProcess, example_repository: Path, protocol: str, udf: str
) -> None:
    settings = config(server, protocol, example_repository)
    with pytest.raises(ModelNotFound) as refused:
        if udf == "predict_arrow":
            predict_arrow(spark.range(1), MISSPELLED, config=settings)
        else:
            remote_predict(MISSPELLED, udf_type=udf.split()[1], config=settings)  # type: ignore[arg-type]
    assert_names_the_model_and_the_servers_models(refused.value, server)


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_a_task_whose_server_has_no_such_model_fails_without_falling_back(
    server: ServerProcess, example_repository: Path, protocol: str
) -> None:
    settings = config(server, protocol, example_repository)
    spec = describe_model(server.grpc_target(), settings, "tabular_mlp").spec
    column = pa.FixedSizeListArray.from_arrays(pa.array(feature_values(np.arange(10), (64,)).ravel()), 64)
    stats = ClientStats()
    with pytest.raises(ModelNotFound) as refused:
        list(
            predict_partition(
                PredictJob(MISSPELLED, spec, settings),
                iter([pa.RecordBatch.from_arrays([column], names=["features"])]),
                {},
                TaskPlacement(),
                stats=stats,
                breakers=CircuitBreakers(),
            )
        )
    assert_names_the_model_and_the_servers_models(refused.value, server)
    assert (stats.rows_by_fallback, stats.batches_by_fallback) == (0, 0)
