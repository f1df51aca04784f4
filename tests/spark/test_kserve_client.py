"""The Spark client with protocol="kserve" against udfserve's KServe v2 endpoint: the Arrow path's answers.

The Spark tests run both protocols over the same DataFrame in one job and compare row by row;
the others drive the partition runner directly with Arrow batches, so they can count resends
and kill the server at a chosen batch. The same client against a real NVIDIA Triton is checked
by ``python -m benchmarks.kserve.interop`` (a heavy peer, outside the test run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, predict_arrow, remote_predict
from udfserve.spark_client.common.errors import ModelNotFound, RequestRejected
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement, apply_spark_conf
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.protocols import describe_model

ROWS = 20_000

MODELS = {
    # model: (input column, per-row input shape, output name)
    "tabular_mlp": ("features", (64,), "probabilities"),
    "sequence_bilstm": ("lines", (16, 32), "class_probabilities"),
}


def kserve_config(server: ServerProcess, **settings: object) -> ClientConfig:
    """KServe to the server's native front end when it runs one, else to its main address."""
    address = server.kserve_address or server.grpc_target()
    return ClientConfig.model_validate(
        {"address": address, "protocol": "kserve", "fallback": "error", **settings}
    )


def tabular_requests(ids: np.ndarray, rows_per_request: int) -> list[pa.RecordBatch]:
    column = pa.FixedSizeListArray.from_arrays(pa.array(feature_values(ids, (64,)).reshape(-1)), 64)
    batch = pa.RecordBatch.from_arrays([column], names=["features"])
    return [batch.slice(start, rows_per_request) for start in range(0, len(ids), rows_per_request)]


def kserve_job(server: ServerProcess, **settings: object) -> PredictJob:
    config = kserve_config(server, **{"max_in_flight": 6, **settings})
    return PredictJob("tabular_mlp", describe_model(config.address or "", config, "tabular_mlp").spec, config)


def tabular_expected(example_repository: Path, ids: np.ndarray) -> np.ndarray:
    inputs = {"features": feature_values(ids, (64,))}
    return reference_outputs(example_repository, "tabular_mlp", inputs)["probabilities"]


def as_array(column: object) -> np.ndarray:
    """A pandas column of scalars or of (nested) arrays as one numeric array."""
    return np.array([np.array(value.tolist()) if hasattr(value, "tolist") else value for value in column])  # type: ignore[attr-defined]


def predicted(answers: list[pa.RecordBatch]) -> np.ndarray:
    return np.concatenate([a.column(0).flatten().to_numpy().reshape(a.num_rows, -1) for a in answers])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_remote_predict_over_kserve_equals_the_arrow_protocol_row_by_row(
    spark: SparkSession, server: ServerProcess, example_repository: Path, model: str
) -> None:
    column, shape, output = MODELS[model]
    arrow = remote_predict(model, config=ClientConfig(address=server.grpc_target(), fallback="error"))
    kserve = remote_predict(model, config=kserve_config(server))
    result = (
        spark.range(ROWS, numPartitions=2)
        .withColumn(column, feature_column(shape))
        .select("id", arrow(column).alias("arrow"), kserve(column).alias("kserve"))
        .toPandas()
        .sort_values("id")
    )
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(ROWS))
    np.testing.assert_allclose(stacked(result["kserve"]), stacked(result["arrow"]), atol=1e-6)
    reference = reference_outputs(example_repository, model, {column: feature_values(ids, shape)})[output]
    np.testing.assert_allclose(stacked(result["kserve"]), reference, atol=1e-5)
    stats = kserve.stats()
    assert (stats.rows_by_server, stats.rows_by_fallback) == (ROWS, 0)


def test_an_arrow_udf_over_kserve_answers_as_the_pandas_udf_over_the_arrow_protocol(
    spark: SparkSession, server: ServerProcess
) -> None:
    pandas = remote_predict(
        "tabular_mlp", config=ClientConfig(address=server.grpc_target(), fallback="error")
    )
    arrow = remote_predict("tabular_mlp", udf_type="arrow", config=kserve_config(server))
    result = (
        spark.range(ROWS, numPartitions=2)
        .withColumn("features", feature_column((64,)))
        .select("id", pandas("features").alias("pandas"), arrow("features").alias("arrow"))
        .toPandas()
    )
    np.testing.assert_allclose(stacked(result["arrow"]), stacked(result["pandas"]), atol=1e-6)
    stats = arrow.stats()
    assert (stats.rows_by_server, stats.rows_by_fallback) == (ROWS, 0)


def test_predict_arrow_over_kserve_carries_several_inputs_and_outputs_like_the_arrow_protocol(
    spark: SparkSession, server: ServerProcess
) -> None:
    """multi_io: a float vector and an INT32 scalar in, two outputs out (a struct of columns)."""
    frame = (
        spark.range(ROWS, numPartitions=2)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", (F.col("id") % 16).cast("int"))
    )
    arrow = predict_arrow(
        frame, "multi_io", config=ClientConfig(address=server.grpc_target(), fallback="error")
    )
    kserve = predict_arrow(frame, "multi_io", config=kserve_config(server))
    assert kserve.columns == arrow.columns
    outputs = [name for name in arrow.columns if name not in {"id", "numeric", "category"}]
    assert outputs
    left = arrow.select("id", *outputs).toPandas().sort_values("id").reset_index(drop=True)
    right = kserve.select("id", *outputs).toPandas().sort_values("id").reset_index(drop=True)
    assert np.array_equal(right["id"].to_numpy(), np.arange(ROWS))
    for name in outputs:
        np.testing.assert_allclose(as_array(right[name]), as_array(left[name]), atol=1e-6, err_msg=name)


def test_requests_are_cut_to_the_max_batch_size_the_kserve_server_declares(
    spark: SparkSession, server: ServerProcess
) -> None:
    """Triton refuses a request above its max_batch_size; the driver reads it from ModelConfig."""
    udf = remote_predict("tabular_mlp", config=kserve_config(server, rows_per_request=8192))
    declared = describe_model(server.grpc_target(), kserve_config(server), "tabular_mlp").max_rows_per_request
    assert 0 < declared < 8192
    assert udf.job.config.rows_per_request == declared
    arrow = remote_predict(
        "tabular_mlp",
        config=ClientConfig(address=server.grpc_target(), rows_per_request=8192, bytes_per_request=8 << 20),
    )
    assert arrow.job.config.rows_per_request == 8192


def test_the_spark_conf_selects_the_protocol_unless_the_config_names_one() -> None:
    conf = {"spark.udfserve.protocol": "kserve"}
    assert apply_spark_conf(ClientConfig(), conf).protocol == "kserve"
    assert apply_spark_conf(ClientConfig(protocol="arrow"), conf).protocol == "arrow"
    with pytest.raises(ValueError, match=r"(?s)spark\.udfserve\.protocol.*'arrow' or 'kserve'"):
        apply_spark_conf(ClientConfig(), {"spark.udfserve.protocol": "http"})


def test_a_column_the_kserve_codec_cannot_send_fails_the_task_naming_it(server: ServerProcess) -> None:
    """Refused before sending, by the codec the server uses too: no fallback, the column is named."""
    job = kserve_job(server)
    bad = pa.RecordBatch.from_arrays(
        [pa.array([[1.0, None]] * 3, pa.list_(pa.float32()))], names=["features"]
    )
    with pytest.raises(RequestRejected, match=r"column 'features'") as error:
        list(predict_partition(job, iter([bad]), {}, TaskPlacement(), breakers=CircuitBreakers()))
    assert error.value.code == "INVALID_ARGUMENT"


def test_an_unknown_model_fails_in_the_driver_naming_the_server_and_the_model(
    spark: SparkSession, server: ServerProcess
) -> None:
    with pytest.raises(ModelNotFound, match=r"model 'no_such_model' does not exist on the server at"):
        remote_predict("no_such_model", config=kserve_config(server))


def test_exceeds_maximum_queue_size_is_waited_out_not_taken_for_a_failure(
    throttled_server: ServerProcess,
) -> None:
    """The KServe endpoint answers a full queue as Triton does (UNAVAILABLE, "Exceeds maximum queue
    size"); the client backs off and resends instead of taking the CPU fallback (whose repository
    does not exist, so taking it would fail the test)."""
    ids = np.arange(6_000)
    config = kserve_config(throttled_server, max_in_flight=6, model_repository="/nonexistent-repository")
    spec = describe_model(throttled_server.grpc_target(), config, "slow_sum").spec
    column = pa.FixedSizeListArray.from_arrays(pa.array(feature_values(ids, (4,)).reshape(-1)), 4)
    batch = pa.RecordBatch.from_arrays([column], names=["features"])
    stats = ClientStats()
    answers = list(
        predict_partition(
            PredictJob("slow_sum", spec, config),
            iter([batch.slice(start, 1_000) for start in range(0, len(ids), 1_000)]),
            {},
            TaskPlacement(),
            stats=stats,
            breakers=CircuitBreakers(),
        )
    )
    assert stats.backoff_waits > 0 and stats.retries == stats.backoff_waits
    assert (stats.rows_by_server, stats.rows_by_fallback, stats.server_failures) == (6_000, 0, {})
    predicted = np.concatenate([a.column(0).to_numpy() for a in answers])
    np.testing.assert_allclose(predicted, 2.0 * feature_values(ids, (4,)).sum(axis=1), atol=1e-5)


NATIVE_FRONTEND = ["--kserve-frontend", "native", "--kserve-port", "0"]


@pytest.fixture(scope="module")
def native_server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """udfserve with its native KServe front end (on a port of its own)."""
    folder = tmp_path_factory.mktemp("native")
    process = launch_server(
        example_repository,
        socket=folder / "grpc.sock",
        http_port=None,
        extra_args=["--models", "tabular_mlp,multi_io", *NATIVE_FRONTEND],
        log_path=folder / "server.log",
    )
    yield process
    process.terminate()


def test_remote_predict_over_the_native_kserve_front_end_equals_the_arrow_protocol(
    spark: SparkSession, native_server: ServerProcess, example_repository: Path
) -> None:
    assert native_server.kserve_address is not None
    arrow = remote_predict(
        "tabular_mlp", config=ClientConfig(address=native_server.grpc_target(), fallback="error")
    )
    kserve = remote_predict("tabular_mlp", config=kserve_config(native_server))
    result = (
        spark.range(ROWS, numPartitions=2)
        .withColumn("features", feature_column((64,)))
        .select("id", arrow("features").alias("arrow"), kserve("features").alias("kserve"))
        .toPandas()
        .sort_values("id")
    )
    assert np.array_equal(result["id"].to_numpy(), np.arange(ROWS))
    np.testing.assert_allclose(stacked(result["kserve"]), stacked(result["arrow"]), atol=1e-6)
    assert (kserve.stats().rows_by_server, kserve.stats().rows_by_fallback) == (ROWS, 0)


def test_predict_arrow_over_the_native_front_end_carries_several_inputs_and_outputs(
    spark: SparkSession, native_server: ServerProcess
) -> None:
    frame = (
        spark.range(2_000, numPartitions=2)
        .withColumn("numeric", feature_column((8,)))
        .withColumn("category", (F.col("id") % 16).cast("int"))
    )
    arrow = predict_arrow(
        frame, "multi_io", config=ClientConfig(address=native_server.grpc_target(), fallback="error")
    )
    kserve = predict_arrow(frame, "multi_io", config=kserve_config(native_server))
    left = arrow.drop("numeric", "category").toPandas().sort_values("id").reset_index(drop=True)
    right = kserve.drop("numeric", "category").toPandas().sort_values("id").reset_index(drop=True)
    for name in left.columns:
        np.testing.assert_allclose(as_array(right[name]), as_array(left[name]), atol=1e-6, err_msg=name)


@pytest.fixture(params=["python", "native"])
def own_server(
    request: pytest.FixtureRequest, example_repository: Path, tmp_path: Path
) -> Iterator[ServerProcess]:
    process = launch_server(
        example_repository,
        socket=tmp_path / "grpc.sock",
        port=None,
        http_port=0,
        extra_args=NATIVE_FRONTEND if request.param == "native" else [],
        log_path=tmp_path / "server.log",
    )
    yield process
    if process.process.poll() is None:
        process.terminate()


def test_a_kserve_server_killed_mid_partition_loses_and_duplicates_no_row(
    own_server: ServerProcess, example_repository: Path
) -> None:
    """SIGKILL when the partition asks for its 6th batch: what the server answered before is kept,
    every other batch is computed once on the CPU, in order."""
    ids = np.arange(12_000)
    batches = tabular_requests(ids, 1_000)

    def killing_at_batch(kill_before: int) -> Iterator[pa.RecordBatch]:
        for index, batch in enumerate(batches):
            if index == kill_before:
                own_server.kill()
            yield batch

    job = kserve_job(own_server, fallback="cpu", model_repository=str(example_repository), max_in_flight=2)
    stats = ClientStats()
    answers = list(
        predict_partition(
            job, killing_at_batch(5), {}, TaskPlacement(), stats=stats, breakers=CircuitBreakers()
        )
    )
    assert [a.num_rows for a in answers] == [b.num_rows for b in batches]
    assert stats.rows_by_server + stats.rows_by_fallback == len(ids)
    assert stats.rows_by_server >= 3_000 and stats.rows_by_fallback > 0
    assert set(stats.fallback_reasons) <= {"server_error:UNAVAILABLE", "connect_failed"}, (
        stats.fallback_reasons
    )
    np.testing.assert_allclose(predicted(answers), tabular_expected(example_repository, ids), atol=1e-5)
