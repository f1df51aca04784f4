"""Every metric and label the Grafana dashboard queries exists in a real scrape.

The scrapes come from the compose `udfserve-node` service run here (conftest.py): its model
server, after one good and one bad request carrying a Spark application's metadata, and its
supervisor, after a report of rows a Spark client's CPU fallback answered. The labels Prometheus
adds to every series (node, role, device) are read from the targets file that same supervisor
wrote.

GPU gauges cannot appear without NVML and an NVIDIA device, which this machine lacks: their
names and labels are checked against those declared in services/model_server/observability/gpu_metrics.py
instead (read from its source, so nothing here invents them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from compose_harness import ComposeNode
from deploy_files import (
    DASHBOARD_FILE,
    declared_gpu_series,
    exposition_series,
    legend_label_names,
    promql_label_names,
    promql_metric_names,
)

from udfserve.fallback_reports import add_fallback_rows, report_path
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import encode_batch

PROMETHEUS_LABELS = {"instance", "job"}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(where, expression, legend) for every panel target and template variable."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    queries = [
        (f"panel {panel['title']!r}", target["expr"], target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        queries.append((f"variable {variable['name']!r}", variable["query"]["query"], ""))
    return queries


SPARK_JOB_METADATA = (
    ("udfserve-spark-app-id", "app-20261122000000-0001"),
    ("udfserve-spark-app-name", "dashboard check"),
    ("udfserve-spark-stage-id", "1"),
    ("udfserve-spark-partition-id", "0"),
)
"""What the Spark client attaches to every stream (spark_client/observability/job_context.py): the
per-application series of the dashboard's Spark rows appear only for requests that carry it."""


def predict(target: str, features: np.ndarray) -> pb.PredictResponse:
    column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), features.shape[1])
    payload = encode_batch(pa.record_batch({"features": column}))
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        request = pb.PredictRequest(model="tabular_mlp", batch_id=1, arrow_ipc=payload)
        [response] = list(stub.Predict(iter([request]), timeout=60, metadata=SPARK_JOB_METADATA))
    return response


def scrape(address: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def series(gpu_compose_node: ComposeNode) -> Iterator[dict[str, set[str]]]:
    """Metric name to label names, over the server, the supervisor and the declared GPU gauges.

    Target labels (from the targets file) are added to the series of their target, as
    Prometheus adds them.
    """
    discovery = gpu_compose_node.discovery()
    [server] = discovery["servers"]
    target = f"unix://{server['unix_socket']}"
    good = predict(target, np.ones((5, 64), np.float32))
    bad = predict(target, np.ones((5, 63), np.float32))
    assert not good.HasField("error"), good.error.message
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], bad
    # as a Spark client whose CPU fallback answered rows on the node: the supervisor's counter of them
    reports = Path(discovery["fallback_reports_dir"])
    add_fallback_rows(report_path(reports, os.geteuid(), os.getpid(), {}), "app-dashboard", "tabular_mlp", 10)
    labels_by_role = {
        t["labels"]["role"]: set(t["labels"]) | PROMETHEUS_LABELS for t in gpu_compose_node.targets()
    }
    found: dict[str, set[str]] = {}
    for name, labels in exposition_series(scrape(server["http_address"])).items():
        found[name] = labels | labels_by_role["model_server"]
    for name, labels in exposition_series(scrape(gpu_compose_node.supervisor_address())).items():
        found.setdefault(name, set()).update(labels | labels_by_role["supervisor"])
    for name, labels in declared_gpu_series().items():
        found.setdefault(name, set()).update(labels | labels_by_role["model_server"])
    yield found


@pytest.mark.parametrize(("where", "expression", "legend"), dashboard_queries())
def test_dashboard_metrics_exist_in_a_real_scrape(
    where: str, expression: str, legend: str, series: dict[str, set[str]]
) -> None:
    names = promql_metric_names(expression)
    assert names, f"{where} queries no udfserve metric: {expression}"
    missing = names - set(series)
    assert not missing, f"{where} queries {sorted(missing)}, which no scrape exposes"


@pytest.mark.parametrize(("where", "expression", "legend"), dashboard_queries())
def test_dashboard_labels_exist_on_the_series_queried(
    where: str, expression: str, legend: str, series: dict[str, set[str]]
) -> None:
    available = set().union(*(series.get(name, set()) for name in promql_metric_names(expression)))
    used = promql_label_names(expression) | legend_label_names(legend)
    missing = used - available
    assert not missing, f"{where} uses labels {sorted(missing)}; the series carry {sorted(available)}"


def test_successful_requests_are_counted_with_code_ok(gpu_compose_node: ComposeNode, series: Any) -> None:
    """The errors panel selects code!="OK": successes must carry exactly that code."""
    [server] = gpu_compose_node.discovery()["servers"]
    text = scrape(server["http_address"])
    codes = {
        line.split('code="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("udfserve_requests_total{")
    }
    assert {"OK", "INVALID_ARGUMENT"} <= codes


def test_gpu_panels_use_declared_gpu_gauges() -> None:
    gpu = {
        n for _, e, _ in dashboard_queries() for n in promql_metric_names(e) if n.startswith("udfserve_gpu_")
    }
    assert {"udfserve_gpu_utilization_ratio", "udfserve_gpu_memory_used_bytes"} <= gpu
    assert gpu <= set(declared_gpu_series())
