"""A Spark job's counts of sends, resends and payloads add up, resends included, and the demo's
report says them as counted.

A real job in local mode (2 partitions, the pandas UDF of ``remote_predict``) against
``throttled_server`` (conftest.py): a genuinely slow model behind a queue of one 1,000-row request,
refusing at once what does not fit, so that batches are refused RESOURCE_EXHAUSTED and resent. The
server is on a unix socket, so the client puts its payloads in the node's shared memory.
"""

from __future__ import annotations

import urllib.request

import pytest
from pyspark.sql import SparkSession
from spark_data import feature_column

from udfserve.services.demo_report import ServerFigures, traffic_lines
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client import ClientConfig, remote_predict

pytestmark = pytest.mark.slow

MODEL = "slow_sum"
ROWS = 8_000


def counted(server: ServerProcess) -> tuple[float, float]:
    """The server's refusals RESOURCE_EXHAUSTED of the model and its reads of shared memory, so far."""
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    refused = reads = 0.0
    for line in text.splitlines():
        if line.startswith("udfserve_requests_total{") and 'code="RESOURCE_EXHAUSTED"' in line:
            refused += float(line.rsplit(" ", 1)[1])
        elif line.startswith("udfserve_shared_memory_requests_total "):
            reads += float(line.rsplit(" ", 1)[1])
    return refused, reads


def test_a_job_with_resends_counts_every_send_once_and_every_payload_where_it_went(
    spark: SparkSession, throttled_server: ServerProcess
) -> None:
    config = ClientConfig(
        address=throttled_server.grpc_target(), fallback="error", rows_per_request=1_000, max_in_flight=4
    )
    predict = remote_predict(MODEL, config=config)
    frame = spark.range(ROWS, numPartitions=2).withColumn("features", feature_column((4,)))
    refused_before, reads_before = counted(throttled_server)
    frame.select(predict("features").alias("p")).write.format("noop").mode("overwrite").save()
    stats = predict.stats()
    refused_after, reads_after = counted(throttled_server)
    refused, reads = refused_after - refused_before, reads_after - reads_before

    assert stats.rows_by_server == ROWS and stats.batches_by_server == ROWS // 1_000
    assert stats.retries > 0, "no batch was refused: the job did not exercise resends"
    assert stats.retries == stats.backoff_waits == refused  # every resend answers one refusal
    assert stats.sends == stats.batches_by_server + stats.retries
    # the client's sends through shared memory are the server's reads of it
    assert 0 < stats.sends_in_shared_memory == reads
    assert (stats.tasks, stats.task_s > 0) == (2, True)

    lines = traffic_lines(stats, ServerFigures(shared_memory_reads=reads), job_s=1.0)
    inline = stats.sends - stats.sends_in_shared_memory
    assert lines[0].startswith(f"resends                {stats.retries} (RESOURCE_EXHAUSTED")
    assert f"{stats.batches_by_server} batches took {stats.sends} sends" in lines[0]
    assert lines[1] == (
        f"payloads               {stats.sends_in_shared_memory} of {stats.sends} sends through the node's "
        f"shared memory (the servers read {int(reads)} there), {inline} inline"
    )
