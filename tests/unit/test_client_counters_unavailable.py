"""What ``stats()`` says of a UDF that has no accumulator: under Spark Connect, where the servers
count its rows instead; with no session at all, what to do. (The Spark Connect case against a real
session and server: tests/spark_connect/test_connect_counters.py.)"""

from __future__ import annotations

from udfserve.spark_client.observability.job_context import SparkJobContext
from udfserve.spark_client.observability.stats import CountersUnavailable, counters_unavailable


def test_a_connect_application_is_pointed_at_the_servers_counts_of_its_id() -> None:
    error = counters_unavailable(SparkJobContext(app_id="local-17", app_name="scoring"))

    assert isinstance(error, CountersUnavailable) and isinstance(error, RuntimeError)
    message = str(error)
    assert "Spark Connect session (application 'local-17', name 'scoring')" in message
    assert 'udfserve_app_rows_total{app_id="local-17"}' in message and "/v1/spark/applications" in message
    assert "CPU fallback answered are not counted there" in message
    assert 'udfserve_client_fallback_rows_total{application="local-17"}' in message


def test_a_udf_built_without_a_session_is_told_to_start_one_first() -> None:
    message = str(counters_unavailable(SparkJobContext()))

    assert "without a SparkContext" in message and "name no application" in message
    assert "expected a SparkSession started before the UDF is built" in message
