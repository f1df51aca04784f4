"""Which files predict_files reads, and how it cuts them into tasks (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from udfserve.spark_client.file_reads import FileReadError, FileSplit, list_files, plan_splits, read_schema


def write_ids(path: Path, rows: int, row_group_rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(rows)}), path, row_group_size=row_group_rows)


def test_a_folder_lists_its_files_recursively_in_order_skipping_hidden_ones(tmp_path: Path) -> None:
    for name in ["b.parquet", "a.parquet", "sub/c.parquet", "_SUCCESS", ".a.parquet.crc", "_tmp/d.parquet"]:
        write_ids(tmp_path / name, 1, 1)
    assert list_files(str(tmp_path)) == [
        str(tmp_path / n) for n in ["a.parquet", "b.parquet", "sub/c.parquet"]
    ]


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
    assert {s.planned_row_groups for s in splits} == {10}


def test_a_file_of_one_row_group_stays_one_task(tmp_path: Path) -> None:
    write_ids(tmp_path / "a.parquet", 10, 100)
    assert plan_splits([str(tmp_path / "a.parquet")], min_splits=4) == [
        FileSplit(str(tmp_path / "a.parquet"))
    ]
