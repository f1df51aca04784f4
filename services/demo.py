"""`udfserve demo`: the end-to-end job of the README's first command.

Generates the example models if absent, starts `udfserve node` on this machine's devices (the
CPU when there is no GPU) in a private runtime folder with free ports, scores a generated
DataFrame through `remote_predict` on local Spark, prints a report, and stops everything it
started; with ``--keep-running`` the node stays up after the report, for its metrics, until
Ctrl-C. The DataFrame's columns are generated from the model's declared inputs
(``demo_data``), so any model of the repository can be scored. With ``--no-start-node`` it runs
the same job against a node that is already running (the compose stack's `demo` service does
that).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO, cast

from udfserve.discovery import NodeDiscovery, default_discovery_path, read_discovery
from udfserve.services.demo_data import describe_inputs, format_value, input_columns
from udfserve.services.demo_node import (
    DemoError,
    StartedNode,
    node_addresses,
    running_node,
    scrape_total,
    wait_until_interrupted,
)
from udfserve.services.demo_report import ServerFigures, WarmUp, traffic_lines, untrained_note, warm_up_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from udfserve.spark_client.observability.stats import ClientStats

logger = logging.getLogger(__name__)

WARM_UP_ROWS_PER_SLOT = 1024
"""Rows per task slot of the warm-up job: a request or two, enough to start a Python worker."""


@dataclass(frozen=True)
class DemoOptions:
    rows: int
    model: str
    udf_type: Literal["pandas", "arrow"]
    model_repository: Path
    devices: str
    spark_master: str
    partitions: int
    start_node: bool
    discovery_file: Path | None
    node_start_timeout_s: float
    keep_running: bool
    warm_up_rows_per_slot: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to score (default 1,000,000)")
    parser.add_argument(
        "--model",
        default="tabular_mlp",
        help="model of the repository to score with; its input columns are generated from its declared "
        f"inputs (default tabular_mlp; the example models: {', '.join(example_model_names())})",
    )
    parser.add_argument(
        "--udf-type",
        choices=("pandas", "arrow"),
        default="pandas",
        help="the kind of Spark UDF remote_predict makes: a pandas UDF (default) or an Arrow UDF "
        "(PySpark 4.1+, no pandas in the Python workers)",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=Path("model_repository"),
        help="model repository; example models are generated there if absent (default ./model_repository)",
    )
    parser.add_argument(
        "--devices", default="auto", help='devices for `udfserve node` (default "auto": GPUs, else the CPU)'
    )
    parser.add_argument("--spark-master", default="local[2]", help="Spark master URL (default local[2])")
    parser.add_argument(
        "--partitions", type=int, default=0, help="partitions of the scored DataFrame (default: 2 per core)"
    )
    parser.add_argument(
        "--warm-up-rows",
        type=int,
        default=WARM_UP_ROWS_PER_SLOT,
        help="rows per task slot of a first, untimed job through another remote_predict UDF: it starts "
        "Spark's Python workers, their imports and their connections to the servers, which a Spark "
        "application pays once, so that the throughput reported is the steady rate of its jobs "
        f"(default {WARM_UP_ROWS_PER_SLOT:,}; 0: no warm-up, the timed job pays that start)",
    )
    parser.add_argument(
        "--no-start-node",
        dest="start_node",
        action="store_false",
        help="use the node already running on this machine instead of starting one",
    )
    parser.add_argument(
        "--discovery-file",
        type=Path,
        default=None,
        help="discovery file of the running node (with --no-start-node; default as the client finds it)",
    )
    parser.add_argument(
        "--node-start-timeout-s",
        type=float,
        default=300.0,
        help="time the node has to become ready (default 300)",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="after the report, keep the node the demo started running, with its /metrics, until Ctrl-C",
    )


def example_model_names() -> list[str]:
    from udfserve.services.examples.generate_models import EXAMPLES
    from udfserve.services.examples.text_classifier import NAME as TEXT_CLASSIFIER

    return [*EXAMPLES, TEXT_CLASSIFIER]


def generate_command(repository: Path, model: str) -> list[str]:
    """The command that writes the example repository, the text classifier too when it is the model
    (it needs torch and transformers, which the other examples do not)."""
    from udfserve.services.examples.text_classifier import NAME as TEXT_CLASSIFIER

    command = [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(repository)]
    return [*command, "--text-classifier"] if model == TEXT_CLASSIFIER else command


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    if args.rows < 1:
        raise DemoError(f"--rows must be at least 1, received {args.rows}")
    if args.warm_up_rows < 0:
        raise DemoError(f"--warm-up-rows must be 0 (no warm-up) or more, received {args.warm_up_rows}")
    if args.keep_running and not args.start_node:
        raise DemoError("--keep-running keeps the node the demo starts; with --no-start-node there is none")
    return DemoOptions(
        rows=args.rows,
        model=args.model,
        udf_type="arrow" if args.udf_type == "arrow" else "pandas",
        model_repository=args.model_repository.resolve(),
        devices=args.devices,
        spark_master=args.spark_master,
        partitions=args.partitions or 2 * (os.cpu_count() or 2),
        start_node=args.start_node,
        discovery_file=args.discovery_file,
        node_start_timeout_s=args.node_start_timeout_s,
        keep_running=args.keep_running,
        warm_up_rows_per_slot=args.warm_up_rows,
    )


# -- the steps ---------------------------------------------------------------------------------
def ensure_example_models(repository: Path, model: str) -> None:
    """Generate the example repository in a child process (this one never imports TensorFlow)
    when ``model`` is an example model missing from it; refuse a model that is neither there
    nor an example model, in one line."""
    if (repository / model).is_dir():
        logger.info("step 1/4: model %s present in %s", model, repository)
        return
    examples = example_model_names()
    if model not in examples:
        present = (
            sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
            if repository.is_dir()
            else []
        )
        raise DemoError(
            f"unknown model {model!r}: {repository} holds {', '.join(present) or 'no model'}, and the "
            f"example models are {', '.join(examples)}; expected one of them"
        )
    logger.info("step 1/4: generating the example models into %s", repository)
    subprocess.run(generate_command(repository, model), check=True)


def run_spark_job(options: DemoOptions, discovery_file: Path, discovery: NodeDiscovery) -> dict[str, object]:
    """Score the generated DataFrame through remote_predict; return the figures of the report."""
    from pyspark.sql import SparkSession

    from udfserve.spark_client import remote_predict
    from udfserve.spark_client.common.errors import RemotePredictError

    # PySpark starts its local Python workers with PYSPARK_PYTHON (the Spark conf is not read for
    # that): this driver program, not code that runs in Spark, points it at its own interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(options.spark_master)
        .appName("udfserve-demo")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "16384")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.udfserve.discoveryFile", str(discovery_file))
        # the CPU fallback's model files: the client's own setting, never taken from the node's file
        .config("spark.udfserve.modelRepository", str(options.model_repository))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        # The UDF object: its spec holds the model's inputs, its stats() the client's counters.
        try:
            predict = remote_predict(options.model, udf_type=options.udf_type)
        except RemotePredictError as exc:
            raise DemoError(f"cannot score with model {options.model!r}: {exc}") from None
        inputs = predict.job.spec.inputs
        logger.info(
            "step 3/4: scoring %d rows with %s on Spark %s (generated inputs: %s)",
            options.rows,
            options.model,
            options.spark_master,
            describe_inputs(inputs),
        )
        frame = spark.range(0, options.rows, numPartitions=options.partitions).select(
            "id", *input_columns(inputs)
        )
        scored = frame.select("id", predict(*[tensor.name for tensor in inputs]).alias("prediction"))
        frame.write.format("noop").mode("overwrite").save()  # warm the JVM and the data path
        warm_up = run_warm_up_job(spark, options)
        servers_before = ServerFigures.scrape(discovery, options.model)
        started = time.perf_counter()
        scored.write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - started
        stats = predict.stats()  # read before any other action evaluates the UDF again
        servers = ServerFigures.scrape(discovery, options.model).since(servers_before)
        samples = scored.limit(3).collect()
    finally:
        spark.stop()
    return {
        "seconds": seconds,
        "warm_up": warm_up,
        "servers": servers,
        "client": stats,
        "samples": [(row["id"], format_value(row["prediction"])) for row in samples],
    }


def run_warm_up_job(spark: SparkSession, options: DemoOptions) -> WarmUp | None:
    """Score a few rows per task slot, one task per slot, through a UDF object of their own.

    A Spark application's first Python UDF job starts its Python workers, and each worker
    imports the client and connects to its server: seconds here, paid once, since the workers
    are reused by later jobs. Timing only the job after it reports the rate a job of the
    application runs at; its own UDF object keeps its rows out of the timed job's counters.
    """
    from udfserve.spark_client import remote_predict

    if options.warm_up_rows_per_slot == 0:
        return None
    slots = spark.sparkContext.defaultParallelism
    rows = options.warm_up_rows_per_slot * slots
    predict = remote_predict(options.model, udf_type=options.udf_type)
    inputs = predict.job.spec.inputs
    frame = spark.range(0, rows, numPartitions=slots).select(*input_columns(inputs))
    started = time.perf_counter()
    frame.select(predict(*[tensor.name for tensor in inputs])).write.format("noop").mode("overwrite").save()
    return WarmUp(rows=rows, tasks=slots, seconds=time.perf_counter() - started)


def report(options: DemoOptions, discovery: NodeDiscovery, figures: dict[str, object]) -> str:
    seconds = float(figures["seconds"])  # type: ignore[arg-type]
    servers = cast(ServerFigures, figures["servers"])
    client = cast("ClientStats", figures["client"])
    reasons = ", ".join(f"{reason}: {n} batches" for reason, n in sorted(client.fallback_reasons.items()))
    lines = [
        "",
        "udfserve demo report",
        "--------------------",
        f"rows scored            {options.rows:,} through remote_predict('{options.model}'), "
        + ("an Arrow UDF" if options.udf_type == "arrow" else "a pandas UDF"),
        f"time                   {seconds:.1f} s",
        warm_up_line(cast("WarmUp | None", figures["warm_up"])),
        f"throughput             {options.rows / seconds:,.0f} rows/s",
        f"answered by servers    {client.rows_by_server:,} rows in {client.batches_by_server:,} batches "
        f"(the servers' own metrics count {int(servers.rows):,})",
        f"answered by fallback   {client.rows_by_fallback:,} rows in {client.batches_by_fallback:,} batches"
        + (f" ({reasons})" if reasons else ""),
        *traffic_lines(client, servers, seconds),
        f"model loads            {int(scrape_total(discovery, 'udfserve_model_loads_total', options.model))} "
        f"({len(discovery.servers)} server(s): "
        + ", ".join(f"{s.device} pid {s.pid}" for s in discovery.servers)
        + ")",
        "sample predictions     (first rows)",
    ]
    for row_id, text in figures["samples"]:  # type: ignore[attr-defined]
        lines.append(f"  id {row_id:<4} {text}")
    lines += untrained_note(options.model, example_model_names())
    return "\n".join(lines)


def run_demo(options: DemoOptions, out: TextIO) -> None:
    """Run the demo and write its report to ``out``; with ``keep_running``, then wait for Ctrl-C."""
    ensure_example_models(options.model_repository, options.model)
    with contextlib.ExitStack() as stack:
        node: StartedNode | None = None
        if options.start_node:
            node = stack.enter_context(
                running_node(options.model_repository, options.devices, options.node_start_timeout_s)
            )
            discovery_file = node.discovery_file
        else:
            discovery_file = options.discovery_file or default_discovery_path(os.environ)
            logger.info("step 2/4: using the running node of %s", discovery_file)
        discovery = read_discovery(discovery_file)
        figures = run_spark_job(options, discovery_file, discovery)
        out.write(report(options, discovery, figures) + "\n")
        if node is None:
            out.write("\n".join(node_addresses(discovery)) + "\n")
        elif options.keep_running:
            wait_until_interrupted(node, discovery, out)
            return
        else:
            out.write(
                "metrics                the node stops with the demo: run it with --keep-running to keep "
                "the node up and read its /metrics\n"
            )
        out.flush()
        if node is not None:
            logger.info("step 4/4: stopping the node")


def main(args: argparse.Namespace) -> int:
    try:
        run_demo(options_from_args(args), sys.stdout)
    except DemoError as exc:
        logger.error("%s", exc)
        return 1
    return 0
