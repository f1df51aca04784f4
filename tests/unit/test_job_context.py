"""The Spark job context on a stream: validated, used for labels only, bounded in number."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest

from udfserve.services.model_server.core.job_context import JobContext, SparkApplications, parse_job_context


def applications(max_tracked_apps: int = 3) -> tuple[SparkApplications, CollectorRegistry]:
    registry = CollectorRegistry()
    return SparkApplications(registry, max_tracked_apps, slow_request_s=10.0, buckets=(0.1, 1.0)), registry


def job(app_id: str, app_name: str = "etl") -> JobContext:
    return JobContext(app_id=app_id, app_name=app_name)


def test_known_keys_with_printable_values_are_kept() -> None:
    context = parse_job_context(
        [
            ("udfserve-spark-app-id", "app-2026-0001"),
            ("udfserve-spark-app-name", "nightly scoring"),
            ("udfserve-spark-stage-id", "4"),
            ("udfserve-spark-partition-id", "17"),
            ("user-agent", "grpc-python"),
        ]
    )
    assert context == JobContext(
        app_id="app-2026-0001", app_name="nightly scoring", stage_id="4", partition_id="17"
    )


def test_overlong_unprintable_binary_or_non_numeric_values_are_dropped() -> None:
    context = parse_job_context(
        [
            ("udfserve-spark-app-id", "x" * 10_000),
            ("udfserve-spark-app-name", "bad\x00name"),
            ("udfserve-spark-job-group-bin", b"\xff\xfe"),
            ("udfserve-spark-stage-id", "4; DROP"),
            ("udfserve-spark-unknown", "anything"),
        ]
    )
    assert context == JobContext()


def test_rows_and_requests_are_counted_per_application() -> None:
    apps, registry = applications()
    apps.observe(job("a1"), "tabular_mlp", 1, "OK", 0.01, 100)
    apps.observe(job("a1"), "tabular_mlp", 2, "OK", 0.01, 50)
    apps.observe(job("a1"), "tabular_mlp", 3, "INVALID_ARGUMENT", 0.01, 0)
    [listing] = apps.listing()
    assert (listing["rows"], listing["requests"], listing["errors"]) == (150, 3, 1)
    text = generate_latest(registry).decode()
    assert 'udfserve_app_rows_total{app_id="a1",app_name="etl"} 150.0' in text


def test_requests_without_an_application_are_not_tracked() -> None:
    apps, _ = applications()
    apps.observe(JobContext(), "tabular_mlp", 1, "OK", 0.01, 10)
    assert apps.listing() == []


def test_the_least_recently_seen_application_is_forgotten_with_its_series() -> None:
    apps, registry = applications(max_tracked_apps=2)
    apps.observe(job("a1"), "m", 1, "OK", 0.01, 1)
    apps.observe(job("a2"), "m", 1, "OK", 0.01, 1)
    apps.observe(job("a1"), "m", 2, "OK", 0.01, 1)  # a1 is now the most recent
    apps.observe(job("a3"), "m", 1, "NOT_FOUND", 0.01, 0)
    assert [a["app_id"] for a in apps.listing()] == ["a3", "a1"]
    assert apps.evicted == 1
    assert 'app_id="a2"' not in generate_latest(registry).decode()


def test_thousands_of_distinct_applications_keep_the_series_bounded() -> None:
    apps, registry = applications(max_tracked_apps=5)
    for i in range(3000):
        apps.observe(
            job(f"hostile-{i}", app_name=f"name-{i}"), "m", i, "OK" if i % 2 else "UNAVAILABLE", 0.01, 1
        )
    text = generate_latest(registry).decode()
    app_ids = set(re.findall(r'app_id="([^"]*)"', text))
    assert len(app_ids) == 5
    assert len(apps.listing()) == 5 and apps.evicted == 2995


def test_a_flood_of_failed_requests_is_logged_within_the_budget(caplog) -> None:
    apps, _ = applications()
    with caplog.at_level("WARNING", logger="udfserve.services.model_server.core.job_context"):
        for i in range(1000):
            apps.observe(job("a"), "m", i, "INVALID_ARGUMENT", 0.01, 0)
    assert 1 <= len(caplog.records) <= 20
