"""predict_files against a real model server: parquet read by pyarrow in the Python workers, every
row of the files back once with the model's own outputs, and files that break the plan named."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from spark_data import feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, predict_files

SHAPES = {
    "tabular_mlp": ("features", (64,), "probabilities"),
    "sequence_bilstm": ("lines", (16, 32), "class_probabilities"),
}


def write_rows(path: Path, model: str, ids: np.ndarray, row_group_rows: int = 1_000_000) -> None:
    """``id``, a ``tag`` and the model's input as Spark writes it: a (nested) list of floats."""
    column, shape, _ = SHAPES[model]
    values = pa.array(feature_values(ids, shape).ravel())
    for width in reversed(shape):
        values = pa.FixedSizeListArray.from_arrays(values, width)
    list_type: pa.DataType = pa.float32()
    for _ in shape:
        list_type = pa.list_(list_type)
    table = pa.table({"id": ids, column: values.cast(list_type), "tag": pa.array([f"row-{i}" for i in ids])})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_rows)


def corrupt_first_page(path: Path, column: str) -> None:
    """Overwrites bytes inside the first data page of ``column`` (its header and the footer left
    intact, so the file opens and is planned), as a bad disk block would; pyarrow then fails
    decoding it with ``Unexpected end of stream``, which names no file."""
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    offset = next(
        chunk.column(i).data_page_offset
        for i in range(chunk.num_columns)
        if chunk.column(i).path_in_schema.startswith(column)
    )
    data = bytearray(path.read_bytes())
    data[offset + 100 : offset + 300] = b"\xff" * 200
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="Unexpected end of stream"):
        pq.read_table(path)


def config(server: ServerProcess) -> ClientConfig:
    return ClientConfig(address=server.grpc_target(), fallback="error")


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_every_row_of_the_files_comes_back_once_with_the_models_outputs(
    spark: SparkSession, server: ServerProcess, example_repository: Path, tmp_path: Path, model: str
) -> None:
    column, shape, output = SHAPES[model]
    for part, start in enumerate(range(0, 30_000, 10_000)):
        write_rows(tmp_path / f"part-{part}.parquet", model, np.arange(start, start + 10_000))
    result = predict_files(str(tmp_path), model, config=config(server)).toPandas().sort_values("id")
    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(30_000))
    expected = reference_outputs(example_repository, model, {column: feature_values(ids, shape)})[output]
    np.testing.assert_allclose(stacked(result[output]), expected, atol=1e-5)


def test_the_inputs_stay_out_of_the_result_unless_kept(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(100))
    default = predict_files(str(tmp_path), "tabular_mlp", config=config(server))
    chosen = predict_files(
        str(tmp_path),
        "tabular_mlp",
        ["features"],
        ["p"],
        keep_columns=["features", "id"],
        config=config(server),
    )
    assert default.columns == ["id", "tag", "probabilities"]
    assert chosen.columns == ["features", "id", "p"]
    assert chosen.where("id = 7").first()["features"] == pytest.approx(
        list(feature_values(np.array([7]), (64,))[0])
    )


def test_fewer_files_than_cores_are_read_by_row_groups_each_row_once(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "only.parquet", "tabular_mlp", np.arange(5_000), row_group_rows=1_000)
    frame = predict_files(
        str(tmp_path / "only.parquet"), "tabular_mlp", keep_columns=["id"], config=config(server)
    )
    assert frame.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    counted = frame.selectExpr(
        "count(*) AS n", "count(DISTINCT id) AS d", "min(id) AS lo", "max(id) AS hi"
    ).first()
    assert (counted["n"], counted["d"], counted["lo"], counted["hi"]) == (5_000, 5_000, 0, 4_999)


def test_a_missing_input_column_is_refused_in_the_driver_naming_the_file(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(10))
    with pytest.raises(
        ValueError, match=r"column\(s\) \['lines'\] are not in '.*part-0.parquet', the first of 1"
    ):
        predict_files(str(tmp_path), "sequence_bilstm", config=config(server))


def test_an_output_named_like_a_kept_column_is_refused(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(10))
    with pytest.raises(ValueError, match=r"output column\(s\) \['tag'\] already exist in keep_columns"):
        predict_files(str(tmp_path), "tabular_mlp", output_columns=["tag"], config=config(server))


def test_a_file_of_other_column_types_fails_the_job_naming_the_file_and_column(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(10))
    doubles = pa.table({"id": [10, 11], "features": [[0.5] * 64] * 2, "tag": ["a", "b"]})  # list<double>
    pq.write_table(doubles, tmp_path / "part-1.parquet")
    frame = predict_files(str(tmp_path), "tabular_mlp", config=config(server))
    with pytest.raises(
        Exception, match=r"part-1.parquet': column 'features' is list<element: double>, not list<"
    ):
        frame.collect()


def test_a_file_that_is_not_parquet_fails_the_job_naming_it(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(10))
    (tmp_path / "part-1.csv").write_text("id,features\n")
    frame = predict_files(str(tmp_path), "tabular_mlp", config=config(server))
    with pytest.raises(Exception, match=r"part-1.csv' cannot be read as parquet"):
        frame.collect()


def test_a_link_back_to_its_own_folder_reads_each_row_once_as_sparks_reader_does(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "data/part-0.parquet", "tabular_mlp", np.arange(1_000))
    os.symlink(".", tmp_path / "data/again")
    frame = predict_files(str(tmp_path / "data"), "tabular_mlp", keep_columns=["id"], config=config(server))
    counted = frame.selectExpr("count(*) AS n", "count(DISTINCT id) AS d").first()
    assert (counted["n"], counted["d"]) == (1_000, 1_000)
    assert spark.read.parquet(str(tmp_path / "data")).count() == 1_000


def test_a_link_to_a_folder_outside_the_path_adds_none_of_its_rows_as_sparks_reader_does(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "data/part-0.parquet", "tabular_mlp", np.arange(1_000))
    write_rows(tmp_path / "elsewhere/part-0.parquet", "tabular_mlp", np.arange(1_000, 1_500))
    os.symlink(tmp_path / "elsewhere", tmp_path / "data/linked")
    frame = predict_files(str(tmp_path / "data"), "tabular_mlp", keep_columns=["id"], config=config(server))
    counted = frame.selectExpr("count(*) AS n", "max(id) AS hi").first()
    assert (counted["n"], counted["hi"]) == (1_000, 999)
    assert spark.read.parquet(str(tmp_path / "data")).count() == 1_000


def test_a_file_split_across_tasks_and_rewritten_with_as_many_row_groups_fails_naming_what_changed(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    """Planned as 4 row groups of 1,000 rows in 2 tasks, then rewritten as 4 of 500 before the
    tasks run: the same count of row groups, which the tasks must not take for the planned file."""
    path = tmp_path / "only.parquet"
    write_rows(path, "tabular_mlp", np.arange(4_000), row_group_rows=1_000)
    frame = predict_files(str(path), "tabular_mlp", keep_columns=["id"], config=config(server))
    write_rows(path, "tabular_mlp", np.arange(2_000), row_group_rows=500)
    with pytest.raises(
        Exception,
        match=r"only.parquet' changed after the job was planned \(now [\d,]+ bytes, not [\d,]+; "
        r"row group 0 500 rows of [\d,]+ bytes, not 1,000 of [\d,]+",
    ):
        frame.collect()


def test_a_corrupt_page_in_a_later_file_fails_the_job_naming_the_file(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    write_rows(tmp_path / "part-0.parquet", "tabular_mlp", np.arange(100))
    write_rows(tmp_path / "part-1.parquet", "tabular_mlp", np.arange(100, 200))
    corrupt_first_page(tmp_path / "part-1.parquet", "features")
    frame = predict_files(str(tmp_path), "tabular_mlp", config=config(server))
    with pytest.raises(
        Exception, match=r"part-1.parquet' cannot be read after 0 row\(s\) of the whole file \(.+\); expected"
    ):
        frame.collect()


@pytest.fixture
def own_server(example_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server for one test, which the test kills."""
    folder = tmp_path / "server"
    folder.mkdir()
    process = launch_server(
        example_repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )
    yield process
    process.kill()


def test_a_server_killed_mid_job_loses_and_duplicates_no_row_of_the_files(
    spark: SparkSession, own_server: ServerProcess, example_repository: Path, tmp_path: Path
) -> None:
    """A step after the prediction kills the server with SIGKILL when it sees row ``kill_at``: the
    rows the server had not answered come from the CPU fallback, each once, equal to the model."""
    kill_at, pid = 5_000, own_server.pid
    data = tmp_path / "data"
    for part, start in enumerate(range(0, 30_000, 10_000)):
        write_rows(data / f"part-{part}.parquet", "tabular_mlp", np.arange(start, start + 10_000))

    def kill_server_at_row(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os
        import signal

        for batch in batches:
            if kill_at in batch.column("id").to_pylist():
                os.kill(pid, signal.SIGKILL)
            yield batch

    client = ClientConfig(
        address=own_server.grpc_target(), model_repository=str(example_repository), rows_per_request=1_000
    )
    predicted = predict_files(str(data), "tabular_mlp", keep_columns=["id"], config=client)
    result = predicted.mapInArrow(kill_server_at_row, predicted.schema).toPandas()

    assert own_server.process.wait(timeout=30) == -9
    ids = result["id"].to_numpy()
    assert len(ids) == 30_000 and len(np.unique(ids)) == 30_000
    result = result.sort_values("id")
    expected = reference_outputs(example_repository, "tabular_mlp", {"features": feature_values(ids, (64,))})
    np.testing.assert_allclose(stacked(result["probabilities"]), expected["probabilities"], atol=1e-5)
