"""The public UDFs: ``remote_predict`` (a pandas UDF, or an Arrow UDF) and ``predict_arrow``
(``mapInArrow``).

This module imports no pandas and no pydantic: ``predict_arrow``'s function lives here and its
workers stay pandas-free (about 45 MiB less per Python worker) and pydantic-free (about 15:
``ClientConfig`` is imported where the driver builds a job); the pandas UDF's function is in
``pandas_udf``, the Arrow UDF's in ``arrow_udf``.

Both are built in the driver: the config is completed from the Spark conf, the model's inputs
and outputs are fetched from a server once, and the function Spark ships to the executors is
a closure over that immutable ``PredictJob``. The executors resolve their own server at task
time (``routing.py``), from their own environment, read and never written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

import pyarrow as pa

from udfserve.spark_client.api.output_names import check_output_names
from udfserve.spark_client.api.return_types import resolve_return_type, spark_type
from udfserve.spark_client.api.worker_check import check_python_workers, worker_modules
from udfserve.spark_client.common.errors import ModelMetadataError, ServerUnavailable
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.common.versions import VERSION_FIELD, wants_version
from udfserve.spark_client.executor.convert import answer_to_spark_columns, arrow_to_request, match_inputs
from udfserve.spark_client.executor.partition import PredictJob
from udfserve.spark_client.executor.rechunk import planned_request_rows
from udfserve.spark_client.executor.task import answer_partition
from udfserve.spark_client.nodes.routing import (
    SPARK_CONF_KEYS,
    NoServerFound,
    TaskPlacement,
    apply_spark_conf,
    fallback_problem,
    fallback_repository,
    resolve_route,
)
from udfserve.spark_client.observability.job_context import application_context
from udfserve.spark_client.observability.stats import ClientStats, counters_unavailable, new_accumulator
from udfserve.spark_client.observability.tracing import SPARK_CONF_TRACE_KEYS, apply_trace_conf
from udfserve.spark_client.wire.channels import ConnectFailed
from udfserve.spark_client.wire.credentials import auth_metadata
from udfserve.spark_client.wire.protocols import DescribedModel, describe_model

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from udfserve.spark_client.common.config import ClientConfig  # the driver's: no pydantic in a task

logger = logging.getLogger(__name__)

ColumnOrName = Union["Column", str]


UDF_TYPES = ("pandas", "arrow")


def remote_predict(
    model: str,
    *input_columns: ColumnOrName,
    return_type: DataType | str | None = None,
    udf_type: Literal["pandas", "arrow"] = "pandas",
    with_version: bool = False,
    config: ClientConfig | None = None,
    **config_overrides: Any,
) -> Any:
    """A pandas UDF predicting ``model`` on the node's model server, or on the CPU when none answers.

    With ``input_columns`` it returns the Column (``df.withColumn("p", remote_predict("m", "x"))``);
    without, the UDF itself, to be called with the columns. The columns map to the model's inputs
    in order; a model with several inputs also takes one struct column whose fields are named
    after its inputs. ``return_type`` defaults to what the model declares: a scalar, an array
    for a vector, a struct of the outputs when there are several; one given is refused in the driver
    when it cannot hold the answers unchanged (``return_types``). ``udf_type="arrow"`` makes it
    a PySpark Arrow UDF instead (``arrow_udf``, PySpark 4.1 and later): the same columns in and
    out, with no pandas in the executors' Python workers, which then cost what ``predict_arrow``'s
    do. ``with_version=True`` adds the model version that computed each row: the answer becomes
    a struct of the outputs and ``model_version bigint`` (a ``return_type`` given must then be a
    struct with that field; a struct return type with a ``model_version`` field asks for it too).
    ``config_overrides`` are ``ClientConfig`` fields (``rows_per_request=8192``,
    ``fallback="error"``, ...).
    """
    if udf_type not in UDF_TYPES:
        raise ValueError(
            f"udf_type {udf_type!r} is not a kind of UDF remote_predict makes; expected one of {UDF_TYPES}"
        )
    make_udf: Any
    function_of: Any
    if udf_type == "arrow":
        from udfserve.spark_client.executor.arrow_udf import arrow_function as function_of

        make_udf = _arrow_udf_maker()  # refused before any server is asked
    else:
        from pyspark.sql.functions import pandas_udf as make_udf

        from udfserve.spark_client.executor.pandas_udf import pandas_function as function_of
    job = build_job(model, config, config_overrides)
    check_python_workers(_active_session(), worker_modules(function_of.__module__, job.config.protocol))
    resolved = resolve_return_type(job.spec, return_type, _active_session(), with_version)
    job = dataclasses.replace(job, with_version=resolved.with_version)
    function = function_of(job, resolved.as_struct, resolved.fields)
    spark_udf = make_udf(function, returnType=resolved.return_type)
    udf = RemotePredictUDF(job, spark_udf)
    return udf(*input_columns) if input_columns else udf


def _arrow_udf_maker() -> Any:
    """PySpark's ``arrow_udf``; refused early, in the driver, where PySpark has none."""
    import pyspark
    from pyspark.sql import functions

    maker = getattr(functions, "arrow_udf", None)
    if maker is None:
        raise ValueError(
            f"udf_type='arrow' needs PySpark 4.1 or later (pyspark.sql.functions.arrow_udf); this is PySpark "
            f"{pyspark.__version__}: upgrade it, or use udf_type='pandas'"
        )
    return maker


class RemotePredictUDF:
    """What ``remote_predict`` returns without columns: call it with the input columns.

    For a model with several inputs the columns travel as one struct, so that the worker sees
    their names and matches them to the model's inputs by name. ``spark_udf`` is the underlying
    Spark UDF, a pandas UDF or an Arrow UDF (one argument: a column, a struct, or the inputs in
    order); ``pandas_udf`` is its earlier name. ``stats()`` sums what every task that ran this
    UDF did, read in the driver after an action.
    """

    def __init__(self, job: PredictJob, spark_udf: Any) -> None:
        self.job = job
        self.spark_udf = spark_udf

    @property
    def pandas_udf(self) -> Any:
        """``spark_udf`` under its name from before Arrow UDFs, kept for code that reads it."""
        return self.spark_udf

    def stats(self) -> ClientStats:
        """Rows answered by servers and by the CPU fallback, retries, back-offs and fallback reasons,
        over every action that evaluated this UDF so far (at least once: see
        ``udfserve.spark_client.observability.stats``). Under Spark Connect, ``CountersUnavailable``."""
        return read_stats(self.job)

    @property
    def returnType(self) -> DataType:
        return self.spark_udf.returnType

    def __call__(self, *columns: ColumnOrName) -> Column:
        from pyspark.sql import functions as F

        spec = self.job.spec
        if len(columns) > 1 and len(spec.inputs) == 1:
            raise ValueError(
                f"model {spec.name!r} has one input {spec.input_names[0]!r}; expected one column, received "
                f"{len(columns)}"
            )
        if len(columns) > 1:
            return self.spark_udf(F.struct(*columns))
        return self.spark_udf(*columns)


def predict_arrow(
    df: DataFrame,
    model: str,
    input_columns: Sequence[str] | None = None,
    output_columns: Sequence[str] | None = None,
    *,
    with_version: bool = False,
    config: ClientConfig | None = None,
    **config_overrides: Any,
) -> DataFrame:
    """``df`` with the model's outputs appended as columns, through ``mapInArrow`` (no pandas).

    ``input_columns`` name the columns feeding the model's inputs (default: the columns named
    like the inputs), matched by name when they carry the inputs' names, else in order; or one
    struct column with a field per input. ``output_columns`` name the appended columns (default:
    the model's output names). ``with_version=True`` appends a ``model_version`` column (bigint)
    after them: the model version that computed each row.
    """
    predictor = arrow_predictor(
        model, input_columns, output_columns, with_version=with_version, config=config, **config_overrides
    )
    missing = [c for c in predictor.input_columns if c not in df.columns]
    if missing:
        raise ValueError(f"input column(s) {missing} are not in the DataFrame; its columns are {df.columns}")
    check_output_names(
        df.columns, [field.name for field in predictor.output_fields()], df.sparkSession, "in the DataFrame"
    )
    from pyspark.sql.types import StructType

    return df.mapInArrow(predictor, StructType([*df.schema.fields, *predictor.output_fields()]))


def arrow_predictor(
    model: str,
    input_columns: Sequence[str] | None = None,
    output_columns: Sequence[str] | None = None,
    *,
    with_version: bool = False,
    config: ClientConfig | None = None,
    **config_overrides: Any,
) -> ArrowPredictor:
    """The function ``predict_arrow`` runs in ``mapInArrow``, for use inside your own Arrow function
    (to pre- or post-process in the same pass over the data)."""
    job = build_job(model, config, config_overrides)
    if with_version:
        wants_version(job.spec, None, with_version)  # refuses a model with an output of that name
        job = dataclasses.replace(job, with_version=True)
    check_python_workers(_active_session(), worker_modules(__name__, job.config.protocol))
    spec = job.spec
    inputs = tuple(input_columns) if input_columns is not None else spec.input_names
    if not (len(inputs) == 1 and len(spec.inputs) > 1):
        match_inputs(inputs, spec, "input columns")  # raises early, in the driver
    outputs = tuple(output_columns) if output_columns is not None else spec.output_names
    if len(outputs) != len(spec.outputs):
        raise ValueError(
            f"model {model!r} has outputs {list(spec.output_names)}; expected {len(spec.outputs)} output "
            f"column name(s), received {list(outputs)}"
        )
    return ArrowPredictor(job, inputs, outputs)


@dataclass(frozen=True)
class ArrowPredictor:
    """Arrow batches in, the same batches with the model's outputs appended out, in order."""

    job: PredictJob
    input_columns: tuple[str, ...]
    output_columns: tuple[str, ...]

    def stats(self) -> ClientStats:
        """What the tasks that ran this predictor did, as ``RemotePredictUDF.stats``."""
        return read_stats(self.job)

    def output_fields(self) -> list[Any]:
        """The Spark fields of the appended columns: the outputs, then ``model_version`` when the
        job answers it."""
        from pyspark.sql.types import LongType, StructField

        fields = [
            StructField(name, spark_type(tensor), nullable=True)
            for name, tensor in zip(self.output_columns, self.job.spec.outputs, strict=True)
        ]
        if self.job.with_version:
            fields.append(StructField(VERSION_FIELD, LongType(), nullable=True))
        return fields

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        job = self.job
        requests = ((batch, arrow_to_request(batch, self.input_columns, job.spec)) for batch in batches)
        for original, answer in answer_partition(job, requests):
            columns = answer_to_spark_columns(answer, job.spec)
            names = [*self.output_columns, VERSION_FIELD] if job.with_version else self.output_columns
            yield pa.RecordBatch.from_arrays(
                [*original.columns, *columns], names=[*original.schema.names, *names]
            )


def build_job(model: str, config: ClientConfig | None, overrides: Mapping[str, Any]) -> PredictJob:
    """The immutable job of a UDF: the config completed from the Spark conf, the model's spec, the
    application's id and name, and the accumulator the tasks count into."""
    from udfserve.spark_client.common.config import ClientConfig  # here: the workers import this module

    base = config or ClientConfig()
    if overrides:
        base = ClientConfig.model_validate({**base.model_dump(exclude_unset=True), **overrides})
    spark = _active_session()
    conf = _spark_conf(spark)
    # the tasks get the validated values in a plain dataclass: unpickling ClientConfig would
    # import pydantic in every Python worker (docs/benchmarks.md, "What each import adds")
    full = apply_trace_conf(apply_spark_conf(base, conf), conf).task_config()
    described = describe_in_driver(model, full)
    bytes_per_row = described.spec.input_bytes_per_row()
    rows = planned_request_rows(
        full.rows_per_request, full.bytes_per_request, bytes_per_row, described.max_rows_per_request
    )
    if rows < full.rows_per_request:
        cause = (
            f"the server's max_batch_size is {rows}"
            if rows == described.max_rows_per_request
            else f"bytes_per_request={full.bytes_per_request} at {bytes_per_row} bytes per row"
        )
        logger.info(
            "model %r: requests of %d rows instead of rows_per_request=%d (%s)",
            model,
            rows,
            full.rows_per_request,
            cause,
        )
        full = dataclasses.replace(full, rows_per_request=rows)
    pinned = full.version_consistency == "job" and not full.model_version and described.spec.version > 0
    if pinned:
        # every row of the job from the version serving now (the servers keep it leased for the job)
        full = dataclasses.replace(full, model_version=described.spec.version)
    return PredictJob(
        model=model,
        spec=described.spec,
        config=full,
        application=application_context(spark, full.priority_class),
        counters=_accumulator(spark),
        version_pinned=pinned,
    )


def read_stats(job: PredictJob) -> ClientStats:
    """The accumulated ``ClientStats`` of a job, in the driver; ``CountersUnavailable`` without an
    accumulator (Spark Connect), naming what counts the rows there."""
    if job.counters is None:
        raise counters_unavailable(job.application)
    return ClientStats().merge(job.counters.value)


def describe_in_driver(model: str, config: TaskConfig) -> DescribedModel:
    """The model's spec from a server the driver can reach, else from the repository on the CPU.

    Reading it from the repository imports TensorFlow in the driver; it is the price of a driver
    with no server in reach and ``fallback="cpu"``. A server that refuses the token fails here,
    with ``AuthenticationFailed``, before any task runs.
    """
    environ = os.environ
    tried: list[str] = []
    metadata = auth_metadata(config)
    try:
        route = resolve_route(config, environ, TaskPlacement())
    except NoServerFound as exc:
        cause = str(exc)
    else:
        cause = ""
        for target in route.targets + route.alternates:
            tried.append(target)
            try:
                return describe_model(target, config, model, metadata)
            except ConnectFailed as exc:
                cause = str(exc)
    if config.fallback == "error":
        raise ServerUnavailable(
            f"cannot describe model {model!r}: no model server reachable from the driver (addresses tried: "
            f"{', '.join(tried) or 'none'}; cause: {cause}) and fallback='error'"
        )
    try:
        repository, origin = fallback_repository(config, environ)
    except LookupError as exc:
        raise ModelMetadataError(
            f"cannot describe model {model!r}: no model server reachable from the driver ({cause}), and "
            f"{fallback_problem(exc, cause)}"
        ) from None
    logger.warning(
        "no model server reachable from the driver (%s); reading model %r's inputs and outputs from %s (%s)",
        cause,
        model,
        repository,
        origin,
    )
    from udfserve.spark_client.executor.fallback import cpu_model_spec

    return DescribedModel(cpu_model_spec(repository, model, config.model_version))


# -- driver helpers ----------------------------------------------------------------------------


def _active_session() -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _spark_conf(spark: Any) -> dict[str, str]:
    if spark is None:
        return {}
    conf = {}
    for key in (*SPARK_CONF_KEYS, *SPARK_CONF_TRACE_KEYS):
        value = spark.conf.get(key, None)
        if value:
            conf[key] = value
    return conf


def _accumulator(spark: Any) -> Any:
    """A ``ClientStats`` accumulator on the session's SparkContext; None without one (Spark Connect)."""
    if spark is None:
        return None
    try:
        spark_context = spark.sparkContext
    except Exception:  # Spark Connect sessions have no SparkContext
        return None
    return new_accumulator(spark_context)
