"""``predict_files``: parquet files scored without Spark's reader, read by pyarrow in the Python
workers and streamed to the node's model server.

Spark's own path (``spark.read.parquet`` then a UDF) reads the files in the JVM, turns columns
into rows and rows back into Arrow for the Python worker; for a wide ``array<float>`` column
that costs more CPU than the model (docs/benchmarks.md, section 1). Here Spark only schedules
the work: one task per file, or per group of a file's row groups when there are fewer files
than cores, and receives the kept columns and the predictions. Each task reads its rows with
pyarrow, which hands the parquet pages to the request as Arrow without building rows.

Every row of the files comes back once: the splits cover each file's row groups exactly once,
a task answers its split in order (``answer_partition``), and a task that fails is re-run whole
by Spark, whose sinks keep only a successful attempt's rows. A file that changed between the
plan and its task (other columns, another column type; for a file split across tasks, another
size or other row groups) fails its task with the file named, rather than being read under the
wrong plan: tasks reading parts of one file must read the same version of it. A file whose pages
cannot be read fails its task with the file named too.

The module imports no pandas: the tasks' workers stay as light as ``predict_arrow``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from udfserve.spark_client.api.file_listing import filesystem_of, list_files
from udfserve.spark_client.api.output_names import check_output_names
from udfserve.spark_client.api.udf import ArrowPredictor, _active_session, arrow_predictor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from udfserve.spark_client.common.config import ClientConfig  # the driver's: no pydantic in a task

logger = logging.getLogger(__name__)

SPLIT_FIELDS = ("path", "row_groups", "planned_bytes", "planned_group_rows", "planned_group_bytes")


@dataclass(frozen=True)
class FileShape:
    """A file's size and its row groups' rows and bytes, from its footer: what the plan of a file
    split across tasks relies on. Parquet footers carry no checksum, so these sizes stand in for
    one: a rewrite (other rows, other values, other compression) changes them in practice, and
    tasks that each read some of the row groups must all read the version that was planned."""

    file_bytes: int
    group_rows: tuple[int, ...]
    group_bytes: tuple[int, ...]
    """Each row group's uncompressed bytes, as the footer gives them."""

    @classmethod
    def of(cls, parquet: pq.ParquetFile, file_bytes: int) -> FileShape:
        """The shape of an open file (``file_bytes``: its size on the file system)."""
        groups = [parquet.metadata.row_group(i) for i in range(parquet.metadata.num_row_groups)]
        return cls(file_bytes, tuple(g.num_rows for g in groups), tuple(g.total_byte_size for g in groups))

    def changes(self, now: FileShape) -> list[str]:
        """How ``now`` differs from this planned shape, in words (empty: the same)."""
        found = []
        if now.file_bytes != self.file_bytes:
            found.append(f"{now.file_bytes:,} bytes, not {self.file_bytes:,}")
        if len(now.group_rows) != len(self.group_rows):
            found.append(f"{len(now.group_rows)} row groups, not {len(self.group_rows)}")
            return found
        groups = zip(self.group_rows, self.group_bytes, now.group_rows, now.group_bytes, strict=True)
        differing = [
            f"row group {i} {rows:,} rows of {size:,} bytes, not {was_rows:,} of {was_size:,}"
            for i, (was_rows, was_size, rows, size) in enumerate(groups)
            if (rows, size) != (was_rows, was_size)
        ]
        found += differing[:3] + (
            [f"{len(differing) - 3} more row group(s) changed"] if len(differing) > 3 else []
        )
        return found


class FileReadError(RuntimeError):
    """A file that cannot be read as planned: missing, not parquet, corrupt, or changed since the
    plan."""


@dataclass(frozen=True)
class FileSplit:
    """What one task reads: a file, or some of its row groups."""

    path: str
    """An absolute local path or a URI pyarrow's file systems open (``hdfs://``, ``s3://``, ...)."""
    row_groups: tuple[int, ...] = ()
    """Empty: the whole file."""
    planned: FileShape | None = None
    """The file's shape when the plan was made, for a file split across tasks (None: the whole
    file in one task, which reads one version whatever it is; not checked)."""


@contextlib.contextmanager
def open_parquet(path: str) -> Iterator[tuple[pq.ParquetFile, int]]:
    """``path`` opened as parquet (its footer read) with its size in bytes, closed after the
    block; the error names the file when it cannot be opened or is not parquet."""
    filesystem, inner = filesystem_of(path)
    try:
        handle = filesystem.open_input_file(inner)
    except OSError as error:
        raise FileReadError(
            f"{path!r} cannot be opened ({error}); expected a readable parquet file"
        ) from error
    with handle:
        try:
            parquet = pq.ParquetFile(handle)
        except pa.ArrowInvalid as error:
            raise FileReadError(
                f"{path!r} cannot be read as parquet ({error}); expected a parquet file"
            ) from error
        yield parquet, handle.size()


def read_schema(path: str) -> pa.Schema:
    """A file's Arrow schema, from its footer."""
    with open_parquet(path) as (parquet, _):
        return parquet.schema_arrow


def plan_splits(files: Sequence[str], min_splits: int) -> list[FileSplit]:
    """One split per file; with fewer files than ``min_splits`` (the cores Spark has), files with
    several row groups are cut into contiguous groups of row groups so that every core has work.
    Only then are the files' footers read in the driver."""
    if len(files) >= min_splits:
        return [FileSplit(path) for path in files]
    per_file = -(-min_splits // len(files))
    splits = []
    for path in files:
        with open_parquet(path) as (parquet, file_bytes):
            shape = FileShape.of(parquet, file_bytes)
        groups = len(shape.group_rows)
        parts = max(1, min(per_file, groups))
        if parts == 1:
            splits.append(FileSplit(path))
            continue
        bounds = [round(i * groups / parts) for i in range(parts + 1)]
        splits += [
            FileSplit(path, tuple(range(start, end)), shape) for start, end in itertools.pairwise(bounds)
        ]
    return splits


@dataclass(frozen=True)
class FileScorer:
    """The ``mapInArrow`` function: each split's rows read in batches of ``read_batch_rows``, out as
    the ``returned`` columns, in the files' order."""

    predictor: ArrowPredictor
    read_columns: tuple[str, ...]
    """The kept columns and the inputs, each once, in the file's order."""
    returned: tuple[str, ...]
    """The kept columns, then the predictor's outputs (and ``model_version`` when asked)."""
    expected: pa.Schema
    """The planned types of ``read_columns``, from the first file."""
    read_batch_rows: int

    def __call__(self, splits: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in splits:
            for split in _splits_of(batch):
                for answered in self.predictor(self._read(split)):
                    yield answered.select(list(self.returned))

    def _read(self, split: FileSplit) -> Iterator[pa.RecordBatch]:
        """The split's rows; a page pyarrow cannot read fails with the file named (pyarrow's own
        error, such as ``Unexpected end of stream``, names none), and only pyarrow's errors are
        caught: the consumer's do not pass through here."""
        with open_parquet(split.path) as (parquet, file_bytes):
            self._check(split, parquet, file_bytes)
            batches = parquet.iter_batches(
                batch_size=self.read_batch_rows,
                row_groups=list(split.row_groups) or None,
                columns=list(self.read_columns),
            )
            rows = 0
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except (OSError, pa.ArrowException) as error:
                    part = f"row groups {list(split.row_groups)}" if split.row_groups else "the whole file"
                    raise FileReadError(
                        f"{split.path!r} cannot be read after {rows:,} row(s) of {part} ({error}); "
                        "expected parquet pages that decode: the file is corrupt, cut short or "
                        "being rewritten"
                    ) from error
                rows += batch.num_rows
                yield batch

    def _check(self, split: FileSplit, parquet: pq.ParquetFile, file_bytes: int) -> None:
        schema = parquet.schema_arrow
        problems = []
        for field in self.expected:
            if schema.get_field_index(field.name) < 0:
                problems.append(f"no column {field.name!r}")
            elif not schema.field(field.name).type.equals(field.type):
                problems.append(f"column {field.name!r} is {schema.field(field.name).type}, not {field.type}")
        if problems:
            raise FileReadError(
                f"{split.path!r}: {'; '.join(problems)}; expected the columns of the job's first file: "
                + ", ".join(f"{f.name} {f.type}" for f in self.expected)
            )
        changes = split.planned.changes(FileShape.of(parquet, file_bytes)) if split.planned else []
        if changes:
            raise FileReadError(
                f"{split.path!r} changed after the job was planned (now {'; '.join(changes)}); "
                "expected the planned version, since its row groups are split across tasks that "
                "must all read the same one (rewrite files before a job, or write new ones beside them)"
            )


def _splits_of(batch: pa.RecordBatch) -> Iterator[FileSplit]:
    columns = [batch.column(name).to_pylist() for name in SPLIT_FIELDS]
    for path, groups, size, rows, sizes in zip(*columns, strict=True):
        planned = FileShape(size, tuple(rows), tuple(sizes)) if size else None
        yield FileSplit(path, tuple(groups or ()), planned)


def predict_files(
    paths: str | Sequence[str],
    model: str,
    input_columns: Sequence[str] | None = None,
    output_columns: Sequence[str] | None = None,
    *,
    keep_columns: Sequence[str] | None = None,
    with_version: bool = False,
    read_batch_rows: int = 0,
    spark: SparkSession | None = None,
    config: ClientConfig | None = None,
    **config_overrides: Any,
) -> DataFrame:
    """The rows of the parquet files under ``paths`` with the model's outputs, read by pyarrow in
    the Python workers instead of Spark's reader (fewer CPU-seconds per row: the module's docstring).

    ``paths``: a file, a folder (searched recursively; names starting with ``_`` or ``.`` skipped,
    as Spark does; partition folders give no columns; links to folders inside it not followed,
    with a warning: ``file_listing``), or a list of them; local paths or URIs of the file systems
    pyarrow opens. Every file has the first file's columns and types.
    ``input_columns`` / ``output_columns`` / ``with_version``: as ``predict_arrow``.
    ``keep_columns``: the files' columns to return before the outputs (default: every column that
    is not an input, so the input tensors do not travel back to the JVM).
    ``read_batch_rows``: rows per pyarrow read (0: the client's ``rows_per_request``).

    Returns a DataFrame of one partition per split; nothing is read until an action runs.
    """
    spark = spark or _active_session()
    if spark is None:
        raise RuntimeError("predict_files needs a SparkSession: pass spark=..., or create one first")
    if read_batch_rows < 0:
        raise ValueError(f"read_batch_rows is {read_batch_rows}; expected 0 (the request size) or more rows")
    files = list_files(paths)
    schema = read_schema(files[0])
    predictor = arrow_predictor(
        model, input_columns, output_columns, with_version=with_version, config=config, **config_overrides
    )
    present = set(schema.names)
    inputs = list(predictor.input_columns)
    kept = [n for n in schema.names if n not in inputs] if keep_columns is None else list(keep_columns)
    missing = [c for c in dict.fromkeys([*inputs, *kept]) if c not in present]
    if missing:
        raise ValueError(
            f"column(s) {missing} are not in {files[0]!r}, the first of {len(files)} file(s); "
            f"its columns are {schema.names}"
        )
    outputs = [field.name for field in predictor.output_fields()]
    check_output_names(kept, outputs, spark, "in keep_columns")
    wanted = set(inputs) | set(kept)
    read_columns = tuple(n for n in schema.names if n in wanted)
    scorer = FileScorer(
        predictor=predictor,
        read_columns=read_columns,
        returned=(*kept, *outputs),
        expected=pa.schema([schema.field(n) for n in read_columns]),
        read_batch_rows=read_batch_rows or predictor.job.config.rows_per_request,
    )
    splits = plan_splits(files, _cores(spark))
    logger.info("predict_files: %d file(s) in %d split(s) for model %r", len(files), len(splits), model)
    return _splits_frame(spark, splits).mapInArrow(scorer, _output_schema(schema, kept, predictor))


def _output_schema(schema: pa.Schema, kept: Sequence[str], predictor: ArrowPredictor) -> Any:
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = []
    for name in kept:
        field = schema.field(name)
        try:
            spark_type = from_arrow_type(field.type)
        except TypeError as error:
            raise ValueError(
                f"column {name!r} of the files is {field.type}, which Spark has no type for ({error}); "
                "leave it out of keep_columns"
            ) from error
        fields.append(StructField(name, spark_type, nullable=field.nullable))
    return StructType([*fields, *predictor.output_fields()])


def _cores(spark: Any) -> int:
    """How many tasks Spark runs at once here: its default parallelism (1 without a SparkContext)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect sessions have no SparkContext
        return 1


def _splits_frame(spark: Any, splits: Sequence[FileSplit]) -> DataFrame:
    """One row and one partition per split (``parallelize`` with a slice per element keeps them
    apart exactly; a Spark Connect session, without it, repartitions)."""
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

    longs = ArrayType(LongType(), containsNull=False)
    schema = StructType(
        [
            StructField("path", StringType(), nullable=False),
            StructField("row_groups", ArrayType(IntegerType(), containsNull=False), nullable=False),
            StructField("planned_bytes", LongType(), nullable=False),
            StructField("planned_group_rows", longs, nullable=False),
            StructField("planned_group_bytes", longs, nullable=False),
        ]
    )
    empty = FileShape(0, (), ())
    rows = [
        (s.path, list(s.row_groups), p.file_bytes, list(p.group_rows), list(p.group_bytes))
        for s, p in ((s, s.planned or empty) for s in splits)
    ]
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect
        return spark.createDataFrame(rows, schema).repartition(len(rows))
    return spark.createDataFrame(context.parallelize(rows, len(rows)), schema)
