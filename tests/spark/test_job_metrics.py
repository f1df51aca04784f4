"""A Spark job seen from both ends: the server labels its rows by application, the driver counts them."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from spark_data import feature_column

from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, remote_predict

ROWS = 6_000


def app_rows_metric(server: ServerProcess, app_name: str, app_id: str) -> float:
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    labels = (f'app_name="{app_name}"', f'app_id="{app_id}"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("udfserve_app_rows_total{") and all(label in line for label in labels)
    )


def listed_rows(server: ServerProcess, app_id: str) -> int:
    url = f"http://{server.http_address}/v1/spark/applications"
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return sum(int(app["rows"]) for app in body["applications"] if app["app_id"] == app_id)


@pytest.mark.parametrize("protocol", ["arrow", "kserve"])
def test_the_server_and_the_driver_count_the_same_rows_for_the_application(
    spark: SparkSession, server: ServerProcess, protocol: str
) -> None:
    app_id, app_name = spark.sparkContext.applicationId, spark.sparkContext.appName
    metric_before = app_rows_metric(server, app_name, app_id)
    listed_before = listed_rows(server, app_id)
    predict = remote_predict(
        "tabular_mlp",
        config=ClientConfig(
            address=server.grpc_target(), fallback="error", rows_per_request=1_000, protocol=protocol
        ),
    )
    spark.range(ROWS, numPartitions=2).select(predict(feature_column((64,)))).write.format("noop").mode(
        "overwrite"
    ).save()

    assert app_rows_metric(server, app_name, app_id) - metric_before == ROWS
    assert listed_rows(server, app_id) - listed_before == ROWS
    stats = predict.stats()
    assert (stats.rows_by_server, stats.rows_by_fallback, stats.batches_by_server) == (ROWS, 0, ROWS // 1_000)
    assert stats.rows_by_address == {server.grpc_target(): ROWS}


def test_the_job_group_stage_and_partition_reach_the_server_log_of_a_failed_request(
    spark: SparkSession, server: ServerProcess
) -> None:
    config = ClientConfig(address=server.grpc_target())
    column = remote_predict("tabular_mlp", feature_column((8,)), config=config)  # the model takes 64 values
    spark.sparkContext.setJobGroup("nightly-scoring", "score the n\u00e9w customers")
    try:
        with pytest.raises(Exception, match="INVALID_ARGUMENT"):
            spark.range(10, numPartitions=1).select(column).collect()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        spark.sparkContext.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
    log = Path(server.log_path or "").read_text(errors="replace")
    [line] = [ln for ln in log.splitlines() if "failed request" in ln and "nightly-scoring" in ln]
    assert "code=INVALID_ARGUMENT" in line
    assert "job_description='score the n?w customers'" in line
    assert re.search(r"stage_id='\d+' partition_id='0' task_attempt='0'", line), line
    assert f"app_id='{spark.sparkContext.applicationId}'" in line
