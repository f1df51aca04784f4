"""What the batcher reports: only what the observer implements, and an observer that fails is
logged without failing the request or the batch it measured."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest

from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Chunk, signature


class Broken:
    """An observer of everything that raises on every call."""

    def on_queue_wait(self, model: str, seconds: float) -> None:
        raise RuntimeError("observer down")

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        raise RuntimeError("observer down")

    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        raise RuntimeError("observer down")

    def on_out_of_memory(self, model: str, rows: int) -> None:
        raise RuntimeError("observer down")

    def on_batch_limit(self, model: str, rows: int) -> None:
        raise RuntimeError("observer down")


class BatchesOnly:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        self.calls.append("queue_wait")

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        self.calls.append("batch")


class Answers(BatchesOnly):
    def __init__(self) -> None:
        super().__init__()
        self.answered: list[tuple[float, float]] = []

    def on_request_answered(self, model: str, queue_s: float, compute_s: float) -> None:
        self.answered.append((queue_s, compute_s))


def answered_chunk(loop: asyncio.AbstractEventLoop, queued_s_ago: float, compute_s: float) -> Chunk:
    inputs = {"x": np.zeros(1, np.float32)}
    chunk = Chunk(inputs, 1, signature(inputs), loop.create_future(), 0.0)
    chunk.queued_at_pc = time.perf_counter() - queued_s_ago
    chunk.compute_s = compute_s
    return chunk


def report_everything(reports: Reports, loop: asyncio.AbstractEventLoop) -> None:
    reports.queue_wait(0.001)
    reports.batch(4, 2, 0.001, True)
    reports.answered([answered_chunk(loop, 1.0, 0.5)])
    reports.out_of_memory(4)
    reports.batch_limit(2)


def test_an_observer_that_fails_is_logged_and_never_raises(
    caplog: pytest.LogCaptureFixture, loop: asyncio.AbstractEventLoop
) -> None:
    with caplog.at_level(logging.ERROR):
        report_everything(Reports("m", Broken()), loop)
    assert [record.getMessage() for record in caplog.records] == ["model 'm': batch observer failed"] * 5


def test_only_what_the_observer_implements_is_reported(loop: asyncio.AbstractEventLoop) -> None:
    observer = BatchesOnly()
    report_everything(Reports("m", observer), loop)
    assert observer.calls == ["queue_wait", "batch"]


def test_no_observer_is_no_report(loop: asyncio.AbstractEventLoop) -> None:
    report_everything(Reports("m", None), loop)


def test_an_answered_request_splits_its_time_in_the_batcher_into_compute_and_the_rest(
    loop: asyncio.AbstractEventLoop,
) -> None:
    observer = Answers()
    Reports("m", observer).answered([answered_chunk(loop, 100.0, 30.0), answered_chunk(loop, 100.0, 10.0)])
    ((queue_s, compute_s),) = observer.answered
    assert compute_s == 40.0
    assert queue_s >= 60.0


def test_the_rest_of_the_time_is_never_negative(loop: asyncio.AbstractEventLoop) -> None:
    observer = Answers()
    Reports("m", observer).answered([answered_chunk(loop, 0.0, 30.0)])
    assert observer.answered == [(0.0, 30.0)]
