"""Which files predict_files reads, and how it cuts them into tasks (no Spark needed)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from udfserve.spark_client.api.file_reads import (
    FileReadError,
    FileShape,
    FileSplit,
    list_files,
    plan_splits,
    read_schema,
)


def write_ids(path: Path, rows: int, row_group_rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(rows)}), path, row_group_size=row_group_rows)


def test_a_folder_lists_its_files_recursively_in_order_skipping_hidden_ones(tmp_path: Path) -> None:
    for name in ["b.parquet", "a.parquet", "sub/c.parquet", "_SUCCESS", ".a.parquet.crc", "_tmp/d.parquet"]:
        write_ids(tmp_path / name, 1, 1)
    assert list_files(str(tmp_path)) == [
        str(tmp_path / n) for n in ["a.parquet", "b.parquet", "sub/c.parquet"]
    ]


def test_a_link_back_to_a_folder_above_is_not_followed_and_is_logged_as_a_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_ids(tmp_path / "data/a.parquet", 1, 1)
    (tmp_path / "data/sub").mkdir()
    os.symlink("..", tmp_path / "data/sub/up")
    with caplog.at_level(logging.WARNING):
        assert list_files(str(tmp_path / "data")) == [str(tmp_path / "data/a.parquet")]
    assert (
        f"'{tmp_path}/data/sub/up' is a link to the folder '{tmp_path}/data', a folder above it: a loop"
        in (caplog.text)
    )


def test_a_link_to_a_folder_outside_the_path_is_not_followed_and_names_how_to_read_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_ids(tmp_path / "data/a.parquet", 1, 1)
    write_ids(tmp_path / "elsewhere/b.parquet", 1, 1)
    os.symlink(tmp_path / "elsewhere", tmp_path / "data/linked")
    with caplog.at_level(logging.WARNING):
        assert list_files(str(tmp_path / "data")) == [str(tmp_path / "data/a.parquet")]
    assert f"outside '{tmp_path}/data'; to read its files too, add '{tmp_path}/elsewhere' to the paths" in (
        caplog.text
    )


def test_a_linked_folder_given_as_a_path_is_read(tmp_path: Path) -> None:
    write_ids(tmp_path / "elsewhere/b.parquet", 1, 1)
    os.symlink(tmp_path / "elsewhere", tmp_path / "current")
    assert list_files(str(tmp_path / "current")) == [str(tmp_path / "current/b.parquet")]


def test_a_link_to_a_file_is_read(tmp_path: Path) -> None:
    write_ids(tmp_path / "elsewhere/b.parquet", 1, 1)
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "elsewhere/b.parquet", tmp_path / "data/b.parquet")
    assert list_files(str(tmp_path / "data")) == [str(tmp_path / "data/b.parquet")]


def test_files_named_twice_are_listed_once(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 1, 1)
    assert list_files([str(tmp_path / "a.parquet"), str(tmp_path)]) == [str(tmp_path / "a.parquet")]


def test_a_relative_path_is_made_absolute_for_the_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ids(tmp_path / "a.parquet", 1, 1)
    monkeypatch.chdir(tmp_path)
    assert list_files("a.parquet") == [str(tmp_path / "a.parquet")]


def test_a_file_uri_keeps_its_scheme(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 1, 1)
    assert list_files(f"file://{tmp_path}/") == [f"file://{tmp_path}/a.parquet"]


def test_a_path_that_does_not_exist_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match=r"'.*nowhere' does not exist; expected a parquet file or a folder"
    ):
        list_files(str(tmp_path / "nowhere"))


def test_a_folder_without_data_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").write_text("")
    with pytest.raises(FileNotFoundError, match="no data files under"):
        list_files(str(tmp_path))


def test_a_file_that_is_not_parquet_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not parquet")
    with pytest.raises(
        FileReadError, match=r"notes.txt' cannot be read as parquet .*expected a parquet file"
    ):
        read_schema(str(tmp_path / "notes.txt"))


def test_as_many_files_as_cores_are_one_task_each_without_reading_their_footers(tmp_path: Path) -> None:
    paths = [str(tmp_path / f"missing-{i}.parquet") for i in range(2)]  # never opened
    assert plan_splits(paths, min_splits=2) == [FileSplit(p) for p in paths]


def test_fewer_files_than_cores_are_cut_by_row_groups_covering_each_group_once(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 1000, 100)  # 10 row groups
    splits = plan_splits([str(tmp_path / "a.parquet")], min_splits=3)
    assert [s.row_groups for s in splits] == [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9)]
    assert {len(s.planned.group_rows) for s in splits if s.planned} == {10}


def test_a_split_file_is_planned_with_its_size_and_each_row_groups_rows_and_bytes(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 250, 100)  # row groups of 100, 100 and 50 rows
    planned = {s.planned for s in plan_splits([str(tmp_path / "a.parquet")], min_splits=2)}
    assert len(planned) == 1
    shape = planned.pop()
    assert shape is not None
    assert shape.file_bytes == (tmp_path / "a.parquet").stat().st_size
    assert shape.group_rows == (100, 100, 50)
    assert shape.group_bytes[0] == shape.group_bytes[1] > shape.group_bytes[2] > 0


def test_a_rewrite_with_as_many_row_groups_is_told_apart_by_its_sizes() -> None:
    planned = FileShape(9_000, (1_000, 1_000), (8_000, 8_000))
    rewritten = FileShape(5_000, (500, 500), (4_000, 4_000))
    assert planned.changes(rewritten) == [
        "5,000 bytes, not 9,000",
        "row group 0 500 rows of 4,000 bytes, not 1,000 of 8,000",
        "row group 1 500 rows of 4,000 bytes, not 1,000 of 8,000",
    ]
    assert planned.changes(planned) == []


def test_a_file_of_one_row_group_stays_one_task(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 10, 100)
    assert plan_splits([str(tmp_path / "a.parquet")], min_splits=4) == [
        FileSplit(str(tmp_path / "a.parquet"))
    ]
