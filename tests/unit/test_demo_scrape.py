"""What the demo reads from its servers' /metrics (``demo_node.sample_total``), on the exposition a
real server's registry writes: prometheus_client's parser, not matching lines of text."""

from __future__ import annotations

from udfserve.services.demo_node import SHARED_MEMORY_REQUESTS, sample_total
from udfserve.services.model_server.observability.metrics import ServerMetrics


def exposition() -> str:
    metrics = ServerMetrics("cpu")
    metrics.for_model("tabular_mlp").observe_request("OK", 0.01, 37)
    metrics.for_model("tabular_mlp").observe_request("OK", 0.02, 5)
    metrics.for_model("tabular_mlp_v2").observe_request("OK", 0.01, 1000)  # a name the first begins
    metrics.shared_memory_requests.inc(3)
    return metrics.exposition().decode()


def test_a_models_rows_are_summed_over_its_series_and_no_other_models() -> None:
    assert sample_total(exposition(), "udfserve_rows_total", "tabular_mlp") == 42


def test_a_series_without_a_model_label_is_read_when_no_model_is_named() -> None:
    assert sample_total(exposition(), SHARED_MEMORY_REQUESTS, None) == 3


def test_a_counters_created_sample_is_not_counted_as_its_total() -> None:
    assert sample_total(exposition(), "udfserve_requests_total", "tabular_mlp") == 2
