"""What a Spark Connect user has instead of the client's counters: Spark Connect has no
SparkContext and so no accumulator, so ``stats()`` says so and names the application under which
the model servers count the rows they answer; those per-application counts hold exactly the job's
rows, and a failed request's server log names the Connect session."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.spark_data import feature_column
from tests.spark_connect.connect_data import PATHS, predicted
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, arrow_predictor, remote_predict
from udfserve.spark_client.observability.stats import CountersUnavailable

ROWS = 6_000


def app_rows_metric(server: ServerProcess, app_name: str, app_id: str) -> float:
    """``udfserve_app_rows_total`` of the application, summed over its other labels."""
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    labels = (f'app_name="{app_name}"', f'app_id="{app_id}"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("udfserve_app_rows_total{") and all(label in line for label in labels)
    )


def listed_rows(server: ServerProcess, app_id: str) -> int:
    """The application's rows as ``GET /v1/spark/applications`` lists them."""
    url = f"http://{server.http_address}/v1/spark/applications"
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return sum(int(app["rows"]) for app in body["applications"] if app["app_id"] == app_id)


@pytest.mark.parametrize("kind", ["remote_predict", "arrow_predictor"])
def test_stats_say_there_are_no_counters_and_name_the_application_the_servers_count(
    connect_spark: SparkSession, server: ServerProcess, kind: str
) -> None:
    config = ClientConfig(address=server.grpc_target(), fallback="error")
    built = (remote_predict if kind == "remote_predict" else arrow_predictor)("tabular_mlp", config=config)
    app_id = connect_spark.conf.get("spark.app.id")

    with pytest.raises(CountersUnavailable) as refusal:
        built.stats()
    message = str(refusal.value)
    assert "Spark Connect" in message and "no SparkContext" in message
    assert f"application {app_id!r}" in message
    assert (
        "GET /v1/spark/applications" in message and f'udfserve_app_rows_total{{app_id="{app_id}"}}' in message
    )


@pytest.mark.parametrize("path", PATHS)
def test_the_servers_count_exactly_the_jobs_rows_under_the_connect_application(
    connect_spark: SparkSession, server: ServerProcess, tmp_path: Path, path: str
) -> None:
    app_id, app_name = connect_spark.conf.get("spark.app.id"), connect_spark.conf.get("spark.app.name")
    assert app_id and app_name
    metric_before, listed_before = app_rows_metric(server, app_name, app_id), listed_rows(server, app_id)
    config = ClientConfig(address=server.grpc_target(), fallback="error", rows_per_request=1_000)

    predicted(path, connect_spark, ROWS, config, tmp_path / "files").write.format("noop").mode(
        "overwrite"
    ).save()

    assert app_rows_metric(server, app_name, app_id) - metric_before == ROWS
    assert listed_rows(server, app_id) - listed_before == ROWS


def test_a_failed_requests_server_log_names_the_connect_session_and_the_task(
    connect_spark: SparkSession, server: ServerProcess
) -> None:
    """Spark Connect describes each job with its session id; the client sends the description as
    the job context, so a server's log of a failed request leads back to the session."""
    column = remote_predict(
        "tabular_mlp", feature_column((8,)), config=ClientConfig(address=server.grpc_target())
    )
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):  # the model takes 64 values
        connect_spark.range(10, numPartitions=1).select(column).collect()

    log = Path(server.log_path or "").read_text(errors="replace")
    failed = [
        line for line in log.splitlines() if "failed request" in line and connect_spark.session_id in line
    ]
    assert len(failed) == 1, failed
    assert f"app_id='{connect_spark.conf.get('spark.app.id')}'" in failed[0]
    assert "code=INVALID_ARGUMENT" in failed[0] and "partition_id='0'" in failed[0]
