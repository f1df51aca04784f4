"""The batch limit as a pure object: told the outcome of each backend call, it lowers itself to what
fitted when a call's size was to blame, and grows back one step after enough full calls."""

from __future__ import annotations

from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.row_limit import LIMIT_RECOVERY_CALLS, RowLimit


class MemoryRecorder:
    def __init__(self) -> None:
        self.out_of_memory: list[int] = []
        self.limits: list[int] = []

    def on_queue_wait(self, model: str, seconds: float) -> None:
        pass

    def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
        pass

    def on_out_of_memory(self, model: str, rows: int) -> None:
        self.out_of_memory.append(rows)

    def on_batch_limit(self, model: str, rows: int) -> None:
        self.limits.append(rows)


def limit_of(max_batch_size: int, observer: MemoryRecorder | None = None) -> RowLimit:
    return RowLimit(max_batch_size, Reports("m", observer))


def full_calls(limit: RowLimit, count: int) -> None:
    for _ in range(count):
        limit.on_success(limit.rows)


def test_the_limit_starts_at_max_batch_size_and_is_reported_when_asked() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.report()
    assert (limit.rows, observer.limits) == (32, [32])


def test_a_split_lowers_the_limit_to_the_largest_part_that_fitted() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_split(fitted=[4, 8, 2], row_too_big=False)
    assert (limit.rows, observer.limits) == (8, [8])


def test_a_split_that_found_a_row_too_big_to_fit_alone_lowers_nothing() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_split(fitted=[4, 8], row_too_big=True)
    assert (limit.rows, observer.limits) == (32, [])


def test_a_split_where_nothing_fitted_lowers_nothing() -> None:
    limit = limit_of(32)
    limit.on_split(fitted=[], row_too_big=False)
    assert limit.rows == 32


def test_a_split_never_raises_the_limit() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_split(fitted=[4], row_too_big=False)
    limit.on_split(fitted=[6], row_too_big=False)
    assert (limit.rows, observer.limits) == (4, [4])


def test_each_call_out_of_memory_is_reported_with_its_rows() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_out_of_memory(32)
    limit.on_out_of_memory(1)
    assert observer.out_of_memory == [32, 1]


def test_the_limit_grows_one_step_after_enough_full_calls_in_a_row() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_split(fitted=[4], row_too_big=False)
    full_calls(limit, LIMIT_RECOVERY_CALLS - 1)
    assert limit.rows == 4
    full_calls(limit, 1)
    assert (limit.rows, observer.limits) == (6, [4, 6])  # a step is max_batch_size // 16


def test_calls_smaller_than_the_limit_do_not_count_towards_growing_it() -> None:
    limit = limit_of(32)
    limit.on_split(fitted=[4], row_too_big=False)
    for _ in range(LIMIT_RECOVERY_CALLS):
        limit.on_success(3)
    assert limit.rows == 4


def test_a_call_out_of_memory_starts_the_count_again() -> None:
    limit = limit_of(32)
    limit.on_split(fitted=[4], row_too_big=False)
    full_calls(limit, LIMIT_RECOVERY_CALLS - 1)
    limit.on_out_of_memory(4)
    full_calls(limit, LIMIT_RECOVERY_CALLS - 1)
    assert limit.rows == 4
    full_calls(limit, 1)
    assert limit.rows == 6


def test_a_step_is_at_least_one_row() -> None:
    limit = limit_of(8)
    limit.on_split(fitted=[2], row_too_big=False)
    full_calls(limit, LIMIT_RECOVERY_CALLS)
    assert limit.rows == 3


def test_the_limit_grows_back_to_max_batch_size_and_no_further() -> None:
    observer = MemoryRecorder()
    limit = limit_of(32, observer)
    limit.on_split(fitted=[31], row_too_big=False)
    full_calls(limit, LIMIT_RECOVERY_CALLS)
    full_calls(limit, LIMIT_RECOVERY_CALLS)
    assert (limit.rows, observer.limits) == (32, [31, 32])


def test_a_limit_reported_to_an_observer_without_memory_reports_is_not_an_error() -> None:
    class BatchesOnly:
        def on_queue_wait(self, model: str, seconds: float) -> None:
            pass

        def on_batch(self, model: str, rows: int, requests: int, seconds: float, succeeded: bool) -> None:
            pass

    limit = RowLimit(32, Reports("m", BatchesOnly()))
    limit.on_out_of_memory(32)
    limit.on_split(fitted=[16], row_too_big=False)
    assert limit.rows == 16
