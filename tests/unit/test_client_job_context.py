"""The Spark job context the client sends: cut to what the server accepts, never lost to it."""

from __future__ import annotations

import pytest

from udfserve.services.model_server.core import job_context as server_side
from udfserve.spark_client.observability.job_context import (
    MAX_VALUE_CHARS,
    METADATA_PREFIX,
    SparkJobContext,
    sanitise,
)


def test_the_client_cuts_values_to_the_lengths_the_server_accepts() -> None:
    assert (METADATA_PREFIX, MAX_VALUE_CHARS) == (server_side.METADATA_PREFIX, server_side.MAX_VALUE_CHARS)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("nightly scoring", "nightly scoring"),
        ("caf\u00e9 \u2603 job", "caf? ? job"),
        ("line one\nline\ttwo  ", "line one line two"),
        ("x" * 300, "x" * 128),
        ("\x00\x07bell", "??bell"),
    ],
)
def test_values_become_printable_ascii_within_the_bound(value: str, expected: str) -> None:
    assert sanitise(value, 128) == expected


def test_empty_fields_are_not_sent() -> None:
    assert SparkJobContext(app_id="local-1").metadata() == (("udfserve-spark-app-id", "local-1"),)


def test_everything_the_client_sends_the_server_keeps() -> None:
    context = SparkJobContext(
        app_id="app-20261122-0001",
        app_name="sc\u00f6ring \u2014 nightly " + "n" * 200,
        job_group="group\u00e9one",
        job_description="SELECT *\nFROM t " + "d" * 400,
        stage_id=12,
        partition_id=3,
        task_attempt=1,
    )
    parsed = server_side.parse_job_context(context.metadata())
    assert parsed.app_id == "app-20261122-0001"
    assert parsed.app_name == sanitise(context.app_name, 128) and len(parsed.app_name) == 128
    assert parsed.job_group == "group?one"
    assert parsed.job_description.startswith("SELECT * FROM t ") and len(parsed.job_description) == 256
    assert (parsed.stage_id, parsed.partition_id, parsed.task_attempt) == ("12", "3", "1")
