"""The version of each row: a column the job can ask for, driver-side counters per version, and the
CPU fallback computing the version a server would serve (or the pinned one).

The repository holds ``tabular_mlp`` (the example's ONNX graph) in two versions whose predictions
differ (version 2: the same model with other weights, ``tabular_onnx_version_2``), served by the
policy ``latest: 2``: a request naming no version gets version 2, one pinning version 1 gets
version 1. ``tabular_mlp_newest`` holds the same two versions under ``latest: 1``, which does not
serve version 1.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, arrow_predictor, predict_arrow, remote_predict
from udfserve.spark_client.common.errors import ModelNotFound

ROWS = 3_000
FALLBACK_ROWS = 1_000
"""Fewer rows where the CPU fallback computes them: each task's Python worker loads TensorFlow."""

logger = logging.getLogger(__name__)

POLICIES = {"tabular_mlp": {"latest": 2}, "tabular_mlp_newest": {"latest": 1}}


@pytest.fixture(scope="module")
def versioned_repository(
    tabular_onnx_repository: Path, tabular_onnx_version_2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """``tabular_mlp`` version 1 (the example's ONNX graph) and a version 2 of another seed,
    under each model of ``POLICIES`` with its version policy."""
    root = tmp_path_factory.mktemp("versions") / "repository"
    second = tabular_onnx_version_2
    example = tabular_onnx_repository / "tabular_mlp"
    for name, policy in POLICIES.items():
        shutil.copytree(example / "1", root / name / "1")
        shutil.copytree(second, root / name / "2")
        config = yaml.safe_load((example / "config.yaml").read_text())
        config.update(name=name, version_policy=policy)
        (root / name / "config.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def versioned_server(
    versioned_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("versioned-server")
    process = launch_server(
        versioned_repository,
        socket=folder / "grpc.sock",
        port=0,
        http_port=0,
        log_path=folder / "server.log",
        extra_args=["--models", "tabular_mlp"],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def expected(example_repository: Path, tabular_version_2: Path) -> dict[int, np.ndarray]:
    """Each version's own probabilities for the rows of ids 0 to ROWS - 1, by Keras from the
    versions' weights."""
    inputs = {"features": feature_values(np.arange(ROWS), (64,))}
    outputs = {
        1: reference_outputs(example_repository, "tabular_mlp", inputs)["probabilities"],
        2: reference_outputs(tabular_version_2.parent.parent, "tabular_mlp", inputs, 2)["probabilities"],
    }
    assert not np.allclose(outputs[1], outputs[2], atol=1e-3), "the two versions must predict differently"
    return outputs


def check_rows(rows: Any, version: int, expected: dict[int, np.ndarray]) -> None:
    """Every row carries ``version`` and that version's own prediction."""
    rows = rows.sort_values("id")
    assert set(rows["model_version"]) == {version}
    ids = rows["id"].to_numpy()
    np.testing.assert_allclose(stacked(rows["probabilities"]), expected[version][ids], atol=1e-5)


@pytest.mark.parametrize(
    ("protocol", "udf_type", "asked"),
    [
        ("arrow", "pandas", {"with_version": True}),
        ("kserve", "arrow", {"return_type": "struct<probabilities: array<float>, model_version: bigint>"}),
    ],
    ids=["arrow-pandas-with_version", "kserve-arrow-return_type"],
)
def test_each_row_carries_the_version_the_server_computed_it_with_and_the_counters_agree(
    spark: SparkSession,
    versioned_server: ServerProcess,
    expected: dict[int, np.ndarray],
    protocol: str,
    udf_type: str,
    asked: dict[str, Any],
) -> None:
    address = versioned_server.kserve_address if protocol == "kserve" else None
    config = ClientConfig(
        address=address or versioned_server.grpc_target(),
        protocol=protocol,
        fallback="error",
        rows_per_request=500,
    )
    predict = remote_predict("tabular_mlp", udf_type=udf_type, config=config, **asked)
    frame = spark.range(ROWS, numPartitions=2).select("id", predict(feature_column((64,))).alias("answer"))
    rows = frame.select("id", "answer.probabilities", "answer.model_version").toPandas()

    check_rows(rows, 2, expected)
    stats = predict.stats()
    assert stats.rows_by_version == rows["model_version"].value_counts().to_dict() == {2: ROWS}
    assert (stats.rows_by_server, stats.fallback_rows_by_version) == (ROWS, {})


def test_predict_arrow_appends_the_version_column_after_the_outputs(
    spark: SparkSession, versioned_server: ServerProcess, expected: dict[int, np.ndarray]
) -> None:
    config = ClientConfig(address=versioned_server.grpc_target(), fallback="error")
    frame = spark.range(FALLBACK_ROWS, numPartitions=1).withColumn("features", feature_column((64,)))
    predicted = predict_arrow(frame, "tabular_mlp", with_version=True, config=config)

    assert predicted.columns == ["id", "features", "probabilities", "model_version"]
    assert predicted.schema["model_version"].dataType == T.LongType()
    check_rows(predicted.select("id", "probabilities", "model_version").toPandas(), 2, expected)


def test_predict_arrow_refuses_a_dataframe_that_has_a_model_version_column_already(
    spark: SparkSession, versioned_server: ServerProcess
) -> None:
    config = ClientConfig(address=versioned_server.grpc_target(), fallback="error")
    frame = (
        spark.range(10).withColumn("features", feature_column((64,))).withColumn("model_version", F.lit(0))
    )
    with pytest.raises(
        ValueError, match=r"output column\(s\) \['model_version'\] already exist in the DataFrame"
    ):
        predict_arrow(frame, "tabular_mlp", with_version=True, config=config)


def test_rows_the_fallback_computes_carry_its_version_and_the_counters_agree(
    spark: SparkSession, versioned_repository: Path, expected: dict[int, np.ndarray], tmp_path: Path
) -> None:
    config = ClientConfig(
        address=f"unix://{tmp_path / 'no-server.sock'}", model_repository=str(versioned_repository)
    )
    frame = spark.range(FALLBACK_ROWS, numPartitions=1).withColumn("features", feature_column((64,)))
    predictor = arrow_predictor("tabular_mlp", with_version=True, config=config)
    schema = T.StructType([*frame.schema.fields, *predictor.output_fields()])
    rows = frame.mapInArrow(predictor, schema).select("id", "probabilities", "model_version").toPandas()

    check_rows(rows, 2, expected)  # the version a server of this repository serves by default
    stats = predictor.stats()
    assert stats.rows_by_version == stats.fallback_rows_by_version == {2: FALLBACK_ROWS}
    assert stats.rows_by_fallback == FALLBACK_ROWS


def test_a_pinned_version_is_what_the_fallback_computes(
    spark: SparkSession, versioned_repository: Path, expected: dict[int, np.ndarray], tmp_path: Path
) -> None:
    config = ClientConfig(
        address=f"unix://{tmp_path / 'no-server.sock'}",
        model_repository=str(versioned_repository),
        model_version=1,
    )
    predict = remote_predict("tabular_mlp", with_version=True, config=config)
    frame = spark.range(FALLBACK_ROWS, numPartitions=1).select(
        "id", predict(feature_column((64,))).alias("answer")
    )
    rows = frame.select("id", "answer.probabilities", "answer.model_version").toPandas()

    check_rows(rows, 1, expected)
    stats = predict.stats()
    assert stats.rows_by_version == stats.fallback_rows_by_version == {1: FALLBACK_ROWS}
    assert stats.rows_by_fallback == FALLBACK_ROWS


@pytest.fixture
def version_one_server(tabular_onnx_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server that loaded ``tabular_mlp`` when version 1 was its only version; the test kills it."""
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", tmp_path / "repository" / "tabular_mlp")
    process = launch_server(
        tmp_path / "repository",
        socket=tmp_path / "grpc.sock",
        port=None,
        http_port=0,
        log_path=tmp_path / "server.log",
    )
    yield process
    process.kill()


def test_a_partition_whose_rows_two_versions_computed_tells_them_apart_row_by_row(
    spark: SparkSession,
    version_one_server: ServerProcess,
    versioned_repository: Path,
    expected: dict[int, np.ndarray],
) -> None:
    """The server (version 1) is killed once the first answer of the partition is handed back; the
    CPU fallback, reading the repository where version 2 has been published since, computes the
    rest: one partition, two versions, each row with its own (``version_consistency="request"``: a
    job pinned to its version gets every row from version 1, tests/spark/test_model_rollout.py)."""
    config = ClientConfig(
        address=version_one_server.grpc_target(),
        model_repository=str(versioned_repository),
        rows_per_request=500,
        max_in_flight=2,
        version_consistency="request",
    )
    predictor = arrow_predictor("tabular_mlp", with_version=True, config=config)
    pid = version_one_server.pid

    def kill_after_the_first_answer(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import signal

        requests = (batch.slice(start, 500) for batch in batches for start in range(0, batch.num_rows, 500))
        for index, answered in enumerate(predictor(requests)):
            yield answered
            if index == 0:
                os.kill(pid, signal.SIGKILL)

    frame = spark.range(ROWS, numPartitions=1).withColumn("features", feature_column((64,)))
    schema = T.StructType([*frame.schema.fields, *predictor.output_fields()])
    rows = frame.mapInArrow(kill_after_the_first_answer, schema).select(
        "id", "probabilities", "model_version"
    )
    rows = rows.toPandas()

    assert version_one_server.process.wait(timeout=60) == -9
    assert len(rows) == ROWS and rows["id"].nunique() == ROWS
    counts = rows["model_version"].value_counts().to_dict()
    assert set(counts) == {1, 2}
    for version in (1, 2):
        check_rows(rows[rows["model_version"] == version], version, expected)
    stats = predictor.stats()
    assert stats.rows_by_version == counts
    assert (stats.rows_by_server, stats.fallback_rows_by_version) == (counts[1], {2: counts[2]})
    logger.info(
        "one partition of %d rows: by version %s, by the server %d rows in %d batches, by the fallback %s "
        "in %d batches (reasons %s)",
        ROWS,
        stats.rows_by_version,
        stats.rows_by_server,
        stats.batches_by_server,
        stats.fallback_rows_by_version,
        stats.batches_by_fallback,
        stats.fallback_reasons,
    )


def test_a_pinned_version_the_policy_does_not_serve_is_refused_by_the_fallback(
    versioned_repository: Path,
) -> None:
    from udfserve.spark_client.executor.fallback import load_cpu_model

    with pytest.raises(
        ModelNotFound, match=r"version 1 is not served: its version policy serves \[2\]"
    ) as refusal:
        load_cpu_model(versioned_repository, "tabular_mlp_newest", 1)
    assert "expected ClientConfig.model_version to name a version the policy serves" in str(refusal.value)
