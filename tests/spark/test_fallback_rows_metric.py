"""The rows a Spark job's CPU fallback answers on a node reach Prometheus through the node's
supervisor: ``udfserve_client_fallback_rows_total`` on its /metrics, by model and application.

The node is real (``udfserve node``) and its one server never becomes ready (its repository is a
model's own folder, which holds no servable model), so every task of the job finds the node's
live discovery file, no server to reach, and answers its rows on the CPU.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from spark_data import feature_column

from tests.node.node_harness import NodeProcess, entry_for, scrape, stop_node
from udfserve.spark_client import ClientConfig, predict_arrow

ROWS = 3_000
HOUR = ["--restart-backoff-initial-s", "3600", "--restart-backoff-max-s", "3600"]


@pytest.fixture
def node_without_servers(tabular_onnx_repository: Path) -> Iterator[NodeProcess]:
    root = Path(tempfile.mkdtemp(prefix="udfn-"))  # unix socket paths must stay short
    node = NodeProcess(root / "rt", tabular_onnx_repository / "tabular_mlp", "sim:0", HOUR)
    try:
        node.wait_for(lambda d: bool(entry_for(d, "sim:0").problem), "the problem of sim:0")
        yield node
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def fallback_rows(text: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["model"], s.labels["application"], s.labels["owner"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "udfserve_client_fallback_rows"
        for s in family.samples
        if s.name == "udfserve_client_fallback_rows_total"
    }


def test_a_jobs_fallback_rows_on_a_node_appear_on_its_supervisors_metrics(
    spark: SparkSession, tabular_onnx_repository: Path, node_without_servers: NodeProcess
) -> None:
    node = node_without_servers
    address = node.supervisor_http_address()
    assert fallback_rows(scrape(address)) == {}
    config = ClientConfig(
        discovery_file=str(node.discovery_path), model_repository=str(tabular_onnx_repository)
    )
    frame = spark.range(ROWS, numPartitions=2).withColumn("features", feature_column((64,)))
    answered = predict_arrow(frame, "tabular_mlp", config=config).count()

    application = spark.sparkContext.applicationId
    assert answered == ROWS
    assert fallback_rows(scrape(address)) == {("tabular_mlp", application, "node"): ROWS}
    reports = list((node.runtime_dir / "fallback-reports").iterdir())
    assert reports and all(p.stat().st_mode & 0o777 == 0o644 for p in reports)
