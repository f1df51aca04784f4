"""Large backend calls on a CPU device, cut by rows into concurrent parts."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.core.cpu_parallel import ROW_ALIGNMENT, CallsInFlight, CoreParallelPredict
from udfserve.services.model_server.core.model_table import cpu_parts

TIMEOUT_S = 10.0


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="part")
    yield pool
    pool.shutdown(wait=True)


class Recording:
    """Doubles ``x``; records the rows of each call, and optionally waits for ``meet`` others."""

    def __init__(self, meet: int = 1) -> None:
        self.calls: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(meet, timeout=TIMEOUT_S) if meet > 1 else None

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.calls.append((float(inputs["x"][0, 0]), len(inputs["x"])))
        if self._barrier is not None:
            self._barrier.wait()  # raises BrokenBarrierError unless the parts run at once
        return {"y": inputs["x"] * 2, "n": inputs["x"][:, 0].astype(np.int64)}


def rows(count: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(count * 4, dtype=np.float32).reshape(count, 4)}


def test_a_large_call_runs_as_concurrent_parts_joined_in_row_order(
    executor: Executor,
) -> None:
    backend = Recording(meet=2)
    predict = CoreParallelPredict(backend, parts=2, min_rows_per_part=256, executor=executor)
    inputs = rows(1000)

    outputs = predict(inputs)

    assert sorted(count for _, count in backend.calls) == [448, 552]
    np.testing.assert_array_equal(outputs["y"], inputs["x"] * 2)
    np.testing.assert_array_equal(outputs["n"], inputs["x"][:, 0].astype(np.int64))


def test_a_call_below_twice_the_minimum_runs_whole_in_the_calling_thread(
    executor: Executor,
) -> None:
    backend = Recording()
    predict = CoreParallelPredict(backend, parts=2, min_rows_per_part=256, executor=executor)

    outputs = predict(rows(511))

    assert backend.calls == [(0.0, 511)]
    assert len(outputs["y"]) == 511


def test_a_call_is_not_cut_while_rows_wait_in_the_queue(executor: Executor) -> None:
    """Queued work will take the other cores: cutting would only add the parts' cost."""
    backend = Recording()
    predict = CoreParallelPredict(
        backend, parts=2, min_rows_per_part=256, executor=executor, queued_rows=lambda: 8
    )

    outputs = predict(rows(1000))

    assert backend.calls == [(0.0, 1000)]
    np.testing.assert_array_equal(outputs["y"], rows(1000)["x"] * 2)


def test_a_call_is_not_cut_while_another_backend_call_of_the_server_runs(executor: Executor) -> None:
    calls = CallsInFlight()
    other_model_started, release_other = threading.Event(), threading.Event()

    def other_model(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        other_model_started.set()
        release_other.wait(TIMEOUT_S)
        return {"y": inputs["x"]}

    backend = Recording()
    busy = CoreParallelPredict(other_model, parts=2, min_rows_per_part=256, executor=executor, calls=calls)
    predict = CoreParallelPredict(backend, parts=2, min_rows_per_part=256, executor=executor, calls=calls)
    running = executor.submit(busy, rows(8))
    assert other_model_started.wait(TIMEOUT_S)
    try:
        predict(rows(1000))
    finally:
        release_other.set()
        running.result(TIMEOUT_S)

    assert backend.calls == [(0.0, 1000)]


def test_a_call_is_cut_again_once_the_server_is_otherwise_idle(executor: Executor) -> None:
    calls = CallsInFlight()
    with calls.running():
        pass  # a call that came and went
    backend = Recording(meet=2)
    predict = CoreParallelPredict(backend, parts=2, min_rows_per_part=256, executor=executor, calls=calls)

    predict(rows(1000))

    assert sorted(count for _, count in backend.calls) == [448, 552]


def test_parts_never_exceed_the_cores_nor_go_below_the_minimum_rows(
    executor: Executor,
) -> None:
    predict = CoreParallelPredict(Recording(), parts=4, min_rows_per_part=256, executor=executor)

    assert predict.bounds(4096) == [0, 1024, 2048, 3072, 4096]
    assert predict.bounds(800) == [0, 256, 512, 800]
    assert predict.bounds(100) == [0, 100]


def test_part_boundaries_fall_on_aligned_rows(executor: Executor) -> None:
    predict = CoreParallelPredict(Recording(), parts=3, min_rows_per_part=64, executor=executor)

    for total in (192, 1000, 4097, 12345):
        inner = predict.bounds(total)[1:-1]
        assert inner and all(bound % ROW_ALIGNMENT == 0 for bound in inner), (total, inner)


def test_a_failing_part_fails_the_call_after_every_part_finished(
    executor: Executor,
) -> None:
    finished: list[int] = []

    def fail_second_part(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        first_value = float(inputs["x"][0, 0])
        if first_value > 0:
            raise ValueError("bad row in the second part")
        threading.Event().wait(0.05)  # the first part is still running when the second fails
        finished.append(len(inputs["x"]))
        return {"y": inputs["x"]}

    predict = CoreParallelPredict(fail_second_part, parts=2, min_rows_per_part=64, executor=executor)

    with pytest.raises(ValueError, match="bad row in the second part"):
        predict(rows(256))
    assert finished == [128]


def test_fewer_than_two_parts_or_rows_below_the_alignment_are_refused(
    executor: Executor,
) -> None:
    with pytest.raises(ValueError, match="parts must be at least 2"):
        CoreParallelPredict(Recording(), parts=1, min_rows_per_part=256, executor=executor)
    with pytest.raises(ValueError, match="min_rows_per_part must be at least 64"):
        CoreParallelPredict(Recording(), parts=2, min_rows_per_part=10, executor=executor)


def test_a_gpu_server_or_a_zero_minimum_never_cuts_calls(tmp_path: Path) -> None:
    assert cpu_parts(ServerConfig(model_repository=tmp_path, device="gpu:0", cpu_parallel_min_rows=256)) == 1
    assert cpu_parts(ServerConfig(model_repository=tmp_path, device="cpu", cpu_parallel_min_rows=0)) == 1


def test_calls_are_not_cut_unless_asked(tmp_path: Path) -> None:
    assert cpu_parts(ServerConfig(model_repository=tmp_path, device="cpu")) == 1


def test_a_cpu_device_asked_to_cut_calls_cuts_one_part_per_usable_core(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))

    for device in ("cpu", "sim:1"):
        config = ServerConfig(model_repository=tmp_path, device=device, cpu_parallel_min_rows=256)
        assert cpu_parts(config) == cores


def test_a_minimum_below_the_row_alignment_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match="cpu_parallel_min_rows must be 0 \\(off\\) or at least 64 rows"
    ):
        ServerConfig(model_repository=tmp_path, cpu_parallel_min_rows=32)
