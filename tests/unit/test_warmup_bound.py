"""The warm-up calls every backend makes at load: one row, and the largest batch within a bound
on its input bytes, so a large ``max_batch_size`` cannot make the warm-up allocate gigabytes."""

from __future__ import annotations

from udfserve.runtime.backends.warmup import MAX_INPUT_BYTES, row_counts


def test_a_model_warms_up_with_one_row_and_its_max_batch_size_when_the_batch_is_small() -> None:
    assert row_counts(64, row_bytes=256) == (1, 64)


def test_a_max_batch_size_of_one_warms_up_once() -> None:
    assert row_counts(1, row_bytes=256) == (1,)


def test_the_largest_warm_up_call_holds_at_most_the_bound_of_input_bytes() -> None:
    rows = row_counts(1 << 20, row_bytes=256)[-1]
    assert rows == MAX_INPUT_BYTES // 256
    assert rows * 256 <= MAX_INPUT_BYTES


def test_a_row_wider_than_the_bound_still_warms_up_with_one_row() -> None:
    assert row_counts(1024, row_bytes=MAX_INPUT_BYTES * 2) == (1,)
