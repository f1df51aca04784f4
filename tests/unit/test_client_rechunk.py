"""Spark's batches re-cut into requests, and the answers cut back row for row."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from udfserve.spark_client.executor.rechunk import Pieces, Rechunker, planned_request_rows

EMPTY = pa.RecordBatch.from_arrays([pa.array([], pa.int64())], names=["y"])


def batch(start: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(range(start, start + rows), pa.int64())], names=["x"])


def echo(requests: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """A predictor answering y = x for each request."""
    return [pa.RecordBatch.from_arrays([r.column(0)], names=["y"]) for r in requests]


def run(rechunker: Rechunker[int], sizes: list[int]) -> tuple[list[int], list[tuple[int, list[int]]]]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    inputs = [(i, batch(start, rows)) for i, (start, rows) in enumerate(zip(starts, sizes, strict=True))]
    requests = list(rechunker.requests(iter(inputs)))
    answers = [(carry, answer.column(0).to_pylist()) for carry, answer in rechunker.answers(echo(requests))]
    return [r.num_rows for r in requests], answers


def test_big_batches_are_cut_into_requests_of_the_configured_rows() -> None:
    sizes, answers = run(Rechunker(4, 1 << 20, EMPTY), [10])
    assert sizes == [4, 4, 2]
    assert answers == [(0, list(range(10)))]


def test_small_batches_are_joined_and_each_gets_its_own_rows_back() -> None:
    sizes, answers = run(Rechunker(5, 1 << 20, EMPTY), [2, 2, 2, 3])
    assert sizes == [5, 4]
    assert answers == [(0, [0, 1]), (1, [2, 3]), (2, [4, 5]), (3, [6, 7, 8])]


def test_an_empty_batch_gets_an_empty_answer_in_its_place_without_a_request() -> None:
    sizes, answers = run(Rechunker(3, 1 << 20, EMPTY), [0, 2, 0, 0, 2, 0])
    assert sizes == [3, 1]
    assert answers == [(0, []), (1, [0, 1]), (2, []), (3, []), (4, [2, 3]), (5, [])]


def test_requests_stay_under_half_the_message_limit() -> None:
    rows = 1000  # 8 bytes per row
    sizes, answers = run(Rechunker(10_000, 1600, EMPTY), [rows])
    assert max(sizes) == 100 and sum(sizes) == rows
    assert answers == [(0, list(range(rows)))]


def test_answers_that_do_not_cover_the_requests_are_an_error() -> None:
    rechunker: Rechunker[int] = Rechunker(10, 1 << 20, EMPTY)
    requests = list(rechunker.requests(iter([(0, batch(0, 5))])))
    short = [pa.RecordBatch.from_arrays([requests[0].column(0).slice(0, 3)], names=["y"])]
    with pytest.raises(RuntimeError, match="3 answered rows left over, 5 requested rows unanswered"):
        list(rechunker.answers(short))


def test_a_batch_in_pieces_is_answered_whole_when_each_request_is_answered_before_the_next_is_cut() -> None:
    """One request in flight: the answers run ahead of the pieces, and the batch's answer still
    waits for all the rows it announced."""
    rechunker: Rechunker[int] = Rechunker(2, 1 << 20, EMPTY)
    pieces_read: list[int] = []

    def pieces() -> Iterator[pa.RecordBatch]:
        for start in (0, 2, 4):
            pieces_read.append(start)
            yield batch(start, 2)

    inputs = [(0, Pieces(6, pieces())), (1, batch(6, 1))]
    lockstep = (echo([request])[0] for request in rechunker.requests(iter(inputs)))
    answers = [(carry, answer.column(0).to_pylist()) for carry, answer in rechunker.answers(lockstep)]
    assert answers == [(0, [0, 1, 2, 3, 4, 5]), (1, [6])]
    assert pieces_read == [0, 2, 4]


def test_pieces_that_do_not_hold_the_announced_rows_are_an_error() -> None:
    rechunker: Rechunker[int] = Rechunker(4, 1 << 20, EMPTY)
    with pytest.raises(ValueError, match="announced 5 rows but its pieces hold 2"):
        list(rechunker.requests(iter([(0, Pieces(5, iter([batch(0, 2)])))])))


def test_requests_of_wide_fixed_size_rows_are_cut_to_the_bytes_per_request() -> None:
    assert planned_request_rows(4096, 2 << 20, bytes_per_row=2048) == 1024


def test_narrow_rows_keep_rows_per_request_under_the_bytes_per_request() -> None:
    assert planned_request_rows(4096, 2 << 20, bytes_per_row=256) == 4096


def test_rows_of_varying_size_are_not_cut_by_the_bytes_per_request() -> None:
    assert planned_request_rows(4096, 2 << 20, bytes_per_row=None) == 4096


def test_a_row_bigger_than_the_bytes_per_request_still_travels_alone() -> None:
    assert planned_request_rows(4096, 1 << 10, bytes_per_row=1 << 20) == 1


def test_rows_per_request_under_both_caps_is_kept() -> None:
    assert planned_request_rows(100, 2 << 20, bytes_per_row=2048, max_batch_size=1000) == 100


def test_rows_of_no_bytes_are_not_cut() -> None:
    assert planned_request_rows(4096, 1 << 10, bytes_per_row=0) == 4096


def test_the_servers_max_batch_size_caps_the_rows_per_request() -> None:
    assert planned_request_rows(4096, 2 << 20, bytes_per_row=256, max_batch_size=1000) == 1000
    assert planned_request_rows(4096, 2 << 20, bytes_per_row=2048, max_batch_size=3000) == 1024


def padded(lengths: list[int], rows: int) -> pa.RecordBatch:
    """``rows`` rows of a ``list<float>`` column, row ``i`` of length ``lengths[i % len(lengths)]``."""
    values = [[1.0] * lengths[i % len(lengths)] for i in range(rows)]
    return pa.RecordBatch.from_arrays([pa.array(values, pa.list_(pa.float32()))], names=["x"])


def request_lengths(rechunker: Rechunker[int], batches: list[pa.RecordBatch]) -> list[list[int]]:
    requests = rechunker.requests(enumerate(batches))
    return [r.column(0).value_lengths().to_pylist() for r in requests]


def test_batches_whose_rows_differ_in_length_are_not_joined_into_one_request() -> None:
    # text padded to each Spark batch's longest row: a free dimension of one length per batch
    lengths = request_lengths(
        Rechunker(100, 1 << 20, EMPTY), [padded([3], 4), padded([5], 2), padded([5], 3)]
    )
    assert lengths == [[3] * 4, [5] * 5]


def test_batches_of_nested_lists_are_joined_only_where_every_level_agrees() -> None:
    def nested(inner: int, rows: int) -> pa.RecordBatch:
        values = [[[1.0] * inner] * 2 for _ in range(rows)]
        return pa.RecordBatch.from_arrays([pa.array(values, pa.list_(pa.list_(pa.float32())))], names=["x"])

    requests = list(
        Rechunker(100, 1 << 20, EMPTY).requests(enumerate([nested(2, 3), nested(2, 1), nested(4, 2)]))
    )
    assert [r.num_rows for r in requests] == [4, 2]


def test_a_batch_cut_into_requests_still_joins_its_tail_with_a_next_batch_of_the_same_length() -> None:
    lengths = request_lengths(Rechunker(4, 1 << 20, EMPTY), [padded([3], 6), padded([3], 2)])
    assert lengths == [[3] * 4, [3] * 4]


def test_a_request_holding_a_few_long_rows_is_halved_until_each_part_is_under_half_the_limit() -> None:
    lengths = [10] * 64
    lengths[5] = lengths[40] = 3_000  # far above the batch's average row
    text = pa.array(["x" * n for n in lengths], pa.string())
    requests = list(
        Rechunker(64, 8_000, EMPTY).requests([(0, pa.RecordBatch.from_arrays([text], names=["s"]))])
    )
    assert sum(r.num_rows for r in requests) == 64 and len(requests) > 1
    assert all(r.nbytes <= 4_000 or r.num_rows == 1 for r in requests)
    assert pa.concat_batches(requests).column(0).equals(text)  # every row once, in order
