"""The server's log speaks of a collector it cannot export to once, then at most once a window,
each kind of line on its own (``observability.export_log``), whatever the number of exports."""

from __future__ import annotations

import logging

import pytest

from udfserve.services.model_server.observability.export_log import ExportFailureLog

RETRY = "Transient error %s encountered while exporting traces to %s, retrying in %.2fs."
FAILED = "Failed to export traces to %s, error code: %s"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def logger(clock: Clock) -> logging.Logger:
    logger = logging.getLogger("udfserve.tests.export_failure_log")
    logger.filters.clear()
    logger.addFilter(ExportFailureLog(window_s=300.0, clock=clock))
    logger.propagate = True
    return logger


def export_fails(logger: logging.Logger) -> None:
    logger.warning(RETRY, "UNAVAILABLE", "collector:4317", 1.0)
    logger.error(FAILED, "collector:4317", "UNAVAILABLE")


def test_each_kind_of_export_failure_is_logged_once_however_many_exports_fail(
    logger: logging.Logger, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(50):
            export_fails(logger)
            clock.now += 5.0  # the batch processor's schedule

    assert [record.getMessage() for record in caplog.records] == [
        "Transient error UNAVAILABLE encountered while exporting traces to collector:4317, "
        "retrying in 1.00s.",
        "Failed to export traces to collector:4317, error code: UNAVAILABLE",
    ]


def test_the_first_line_after_the_window_says_how_many_of_its_kind_were_left_out(
    logger: logging.Logger, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(61):  # 0 s to 300 s, every 5 s
            logger.error(FAILED, "collector:4317", "UNAVAILABLE")
            clock.now += 5.0

    assert [record.getMessage() for record in caplog.records] == [
        "Failed to export traces to collector:4317, error code: UNAVAILABLE",
        "Failed to export traces to collector:4317, error code: UNAVAILABLE "
        "(59 more like this left out in the last 300s)",
    ]


def test_lines_below_warning_are_not_counted_or_left_out(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for _ in range(3):
            logger.debug("Reinitializing gRPC channel for %s exporter", "traces")

    assert len(caplog.records) == 3
