"""The Spark conf's trace keys: a job traced without a change to its code."""

from __future__ import annotations

import logging

import pytest

from udfserve.spark_client import ClientConfig
from udfserve.spark_client.observability.tracing import (
    SPARK_CONF_TRACE_JOB,
    SPARK_CONF_TRACE_KEYS,
    SPARK_CONF_TRACE_PARENT,
    SPARK_CONF_TRACE_SAMPLE_RATIO,
    apply_trace_conf,
)
from udfserve.tracing import parse_traceparent

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_trace_keys_are_the_spark_udfserve_trace_ones() -> None:
    assert set(SPARK_CONF_TRACE_KEYS) == {
        "spark.udfserve.trace.job",
        "spark.udfserve.trace.parent",
        "spark.udfserve.trace.sampleRatio",
    }


def test_trace_job_gives_the_udf_a_sampled_trace_of_its_own_and_logs_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        first = apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_JOB: "true"})
        second = apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_JOB: "true"})
    contexts = [parse_traceparent(c.traceparent or "") for c in (first, second)]

    assert all(context is not None and context.sampled for context in contexts)
    assert contexts[0] != contexts[1]
    assert f"traced under trace {contexts[0].trace_id_hex} (spark.udfserve.trace.job)" in caplog.text  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["false", "0", ""])
def test_trace_job_off_leaves_tracing_off(value: str) -> None:
    assert apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_JOB: value}).traceparent is None


def test_trace_parent_names_the_jobs_trace_and_beats_trace_job() -> None:
    conf = {SPARK_CONF_TRACE_PARENT: GIVEN, SPARK_CONF_TRACE_JOB: "true"}

    assert apply_trace_conf(ClientConfig(), conf).traceparent == GIVEN


def test_the_udfs_own_traceparent_beats_both_keys() -> None:
    conf = {SPARK_CONF_TRACE_PARENT: GIVEN, SPARK_CONF_TRACE_JOB: "true"}

    assert apply_trace_conf(ClientConfig(traceparent=OTHER), conf).traceparent == OTHER


def test_trace_sample_ratio_samples_the_tasks_unless_the_udf_sets_one() -> None:
    conf = {SPARK_CONF_TRACE_SAMPLE_RATIO: "0.25"}

    assert apply_trace_conf(ClientConfig(), conf).trace_sample_ratio == 0.25
    assert apply_trace_conf(ClientConfig(trace_sample_ratio=0.5), conf).trace_sample_ratio == 0.5


def test_a_trace_job_value_that_is_not_a_switch_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ValueError, match=r"spark.udfserve.trace.job='maybe' is not a switch; expected true or false"
    ):
        apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_JOB: "maybe"})


def test_a_trace_parent_that_is_not_one_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ValueError, match=r"(?s)Spark conf \(spark.udfserve.trace.parent\).*not a W3C trace context"
    ):
        apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_PARENT: "00-abc-01"})


def test_a_sample_ratio_above_1_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"Spark conf \(spark.udfserve.trace.sampleRatio\)"):
        apply_trace_conf(ClientConfig(), {SPARK_CONF_TRACE_SAMPLE_RATIO: "2"})
