"""The CPU fallback from a Spark Connect session: no server reachable, and a server killed mid-job.
Either way each row is answered once, as the model answers it in this process."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from tests.spark_connect.connect_data import (
    PATHS,
    assert_every_row_once_as_the_model,
    predicted,
    tabular_frame,
)
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, arrow_predictor

pytestmark = pytest.mark.slow  # the Python workers import TensorFlow and load the model

FALLBACK_ROWS = 5_000
"""Rows answered on the CPU, where each Python worker loads the model with TensorFlow."""


def cpu_warnings(spark_log: Path, address: str) -> list[str]:
    """The client's warnings that a partition moved to the CPU after trying ``address``."""
    return [
        line
        for line in spark_log.read_text(errors="replace").splitlines()
        if "on the CPU in this Python worker" in line and address in line
    ]


@pytest.mark.parametrize("path", PATHS)
def test_with_no_server_reachable_every_row_is_answered_on_the_cpu(
    connect_spark: SparkSession,
    example_repository: Path,
    tabular_onnx_repository: Path,
    spark_log: Path,
    tmp_path: Path,
    path: str,
) -> None:
    absent = f"unix://{tmp_path / 'no-server.sock'}"
    config = ClientConfig(address=absent, model_repository=str(tabular_onnx_repository))
    frame = predicted(path, connect_spark, FALLBACK_ROWS, config, tmp_path / "files")

    assert_every_row_once_as_the_model(frame.toPandas(), example_repository, FALLBACK_ROWS)
    warnings = cpu_warnings(spark_log, absent)
    assert len(warnings) == 2, f"expected one warning per partition naming {absent}, found {warnings}"


def test_a_server_killed_mid_job_loses_and_duplicates_no_row(
    connect_spark: SparkSession,
    own_server: ServerProcess,
    example_repository: Path,
    tabular_onnx_repository: Path,
    spark_log: Path,
) -> None:
    """The partition's own function kills the server with SIGKILL once its first answer is handed
    back, so the server fails mid-partition whatever the machine's pace: the client's warning says
    how many batches it had answered, and the CPU fallback computed the rest."""
    rows, rows_per_request = 10_000, 500
    target = own_server.grpc_target()
    config = ClientConfig(
        address=target,
        model_repository=str(tabular_onnx_repository),
        rows_per_request=rows_per_request,
        max_in_flight=2,
    )
    predictor = arrow_predictor("tabular_mlp", config=config)
    pid = own_server.pid

    def kill_after_the_first_answer(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import signal

        # the predictor answers each batch it is given whole: requests of their own, answered one by one
        requests = (
            batch.slice(start, rows_per_request)
            for batch in batches
            for start in range(0, batch.num_rows, rows_per_request)
        )
        for index, answered in enumerate(predictor(requests)):
            yield answered
            if index == 0:
                os.kill(pid, signal.SIGKILL)

    frame = tabular_frame(connect_spark, rows, partitions=1)
    schema = T.StructType([*frame.schema.fields, *predictor.output_fields()])
    result = frame.mapInArrow(kill_after_the_first_answer, schema).select("id", "probabilities").toPandas()

    assert own_server.process.wait(timeout=60) == -9
    assert_every_row_once_as_the_model(result, example_repository, rows)
    [warning] = cpu_warnings(spark_log, target)
    answered = re.search(r"the server failed mid-partition after (\d+) answered batches", warning)
    assert answered, warning
    assert int(answered[1]) >= 1 and int(answered[1]) * rows_per_request < rows, warning
