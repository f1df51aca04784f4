"""`udfserve demo`: the end-to-end job of the README's first command.

Generates the example models if absent, starts `udfserve node` on this machine's devices (the
CPU when there is no GPU) in a private runtime folder with free ports, scores a generated
DataFrame through `remote_predict` on local Spark, prints a report, and stops everything it
started. With ``--no-start-node`` it runs the same job against a node that is already running
(the compose stack's `demo` service does that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from udfserve.discovery import DiscoveryError, NodeDiscovery, default_discovery_path, read_discovery

if TYPE_CHECKING:
    from spark_client.stats import ClientStats

logger = logging.getLogger(__name__)

FEATURES = 64


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


class DemoError(RuntimeError):
    """The demo could not run; the message says which step failed and why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to score (default 1,000,000)")
    parser.add_argument(
        "--model", default="tabular_mlp", help="example model to score with (default tabular_mlp)"
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
        "--node-start-timeout-s", type=float, default=300.0, help="time the node has to become ready"
    )


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    if args.rows < 1:
        raise DemoError(f"--rows must be at least 1, received {args.rows}")
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
    )


# -- the steps ---------------------------------------------------------------------------------
def ensure_example_models(repository: Path, model: str) -> None:
    """Generate the example repository in a child process (this one never imports TensorFlow)."""
    if (repository / model).is_dir():
        logger.info("step 1/4: example models present in %s", repository)
        return
    logger.info("step 1/4: generating the example models into %s", repository)
    subprocess.run(
        [sys.executable, "-m", "services", "models", "generate", "--output", str(repository)], check=True
    )


@contextlib.contextmanager
def running_node(options: DemoOptions) -> Iterator[Path]:
    """Start `udfserve node` in a private runtime folder; yield its discovery file; stop it after."""
    runtime_dir = Path(tempfile.mkdtemp(prefix="udfserve-demo-"))
    discovery_file = runtime_dir / "discovery.json"
    log_path = runtime_dir / "node.log"
    command = [
        sys.executable,
        "-m",
        "services",
        "node",
        "--model-repository",
        str(options.model_repository),
        "--devices",
        options.devices,
        "--runtime-dir",
        str(runtime_dir),
        "--supervisor-http-port",
        "0",
        "--log-level",
        "WARNING",
    ]
    logger.info("step 2/4: starting `udfserve node --devices %s` (log: %s)", options.devices, log_path)
    with open(log_path, "ab") as log:
        node = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_ready_servers(node, discovery_file, log_path, options.node_start_timeout_s)
        yield discovery_file
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        shutil.rmtree(runtime_dir, ignore_errors=True)


def wait_for_ready_servers(
    node: subprocess.Popen[bytes], path: Path, log_path: Path, timeout_s: float
) -> None:
    # The supervisor writes the discovery file atomically once a server is healthy; re-reading
    # it every half second costs nothing next to the seconds a server takes to load TensorFlow.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise DemoError(f"`udfserve node` exited with code {node.returncode}:\n{tail}")
        with contextlib.suppress(DiscoveryError):
            discovery = read_discovery(path)
            if discovery.servers and len(discovery.ready_servers()) == len(discovery.servers):
                return
        time.sleep(0.5)
    raise DemoError(f"`udfserve node` had no ready server after {timeout_s:.0f} s (log: {log_path})")


def metrics_addresses(discovery: NodeDiscovery) -> list[str]:
    """host:port of every model server's /metrics, as Prometheus reaches them.

    The targets file carries the advertised addresses (reachable from other containers of a
    compose stack); the discovery file's addresses are the bound ones, right on the same host.
    """
    if discovery.metrics_targets_file:
        with contextlib.suppress(OSError, ValueError):
            groups = json.loads(Path(discovery.metrics_targets_file).read_text(encoding="utf-8"))
            return [
                target
                for group in groups
                if group.get("labels", {}).get("role") == "model_server"
                for target in group.get("targets", [])
            ]
    return [s.http_address for s in discovery.servers if s.http_address]


SHARED_MEMORY_REQUESTS = "udfserve_shared_memory_requests_total"


def scrape_total(discovery: NodeDiscovery, metric: str, model: str | None) -> float:
    """Sum of one metric over every server of the node, read from their /metrics: the series of
    ``model``, or the unlabelled one when ``model`` is None."""
    total = 0.0
    for address in metrics_addresses(discovery):
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if model is None:
                matches = line.startswith(metric + " ")
            else:
                matches = line.startswith(metric + "{") and f'model="{model}"' in line
            if matches:
                total += float(line.rsplit(" ", 1)[1])
    return total


def run_spark_job(options: DemoOptions, discovery_file: Path, discovery: NodeDiscovery) -> dict[str, object]:
    """Score the generated DataFrame through remote_predict; return the figures of the report."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_client import remote_predict

    logger.info(
        "step 3/4: scoring %d rows with %s on Spark %s", options.rows, options.model, options.spark_master
    )
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
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        features = F.array(*[F.rand(seed=i).cast("float") for i in range(FEATURES)])
        frame = spark.range(0, options.rows, numPartitions=options.partitions).select(
            "id", features.alias("features")
        )
        # The UDF object: its stats() are the client's counters.
        predict = remote_predict(options.model, udf_type=options.udf_type)
        scored = frame.select("id", predict("features").alias("prediction"))
        frame.write.format("noop").mode("overwrite").save()  # warm the JVM and the data path
        rows_before = scrape_total(discovery, "udfserve_rows_total", options.model)
        shared_before = scrape_total(discovery, SHARED_MEMORY_REQUESTS, None)
        started = time.perf_counter()
        scored.write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - started
        stats = predict.stats()  # read before any other action evaluates the UDF again
        server_rows = scrape_total(discovery, "udfserve_rows_total", options.model) - rows_before
        shared_requests = scrape_total(discovery, SHARED_MEMORY_REQUESTS, None) - shared_before
        samples = scored.limit(3).collect()
    finally:
        spark.stop()
    return {
        "seconds": seconds,
        "server_rows": server_rows,
        "shared_memory_requests": shared_requests,
        "client": stats,
        "samples": [(row["id"], list(row["prediction"])) for row in samples],
    }


def report(options: DemoOptions, discovery: NodeDiscovery, figures: dict[str, object]) -> str:
    seconds = float(figures["seconds"])  # type: ignore[arg-type]
    counted_by_servers = int(figures["server_rows"])  # type: ignore[call-overload]
    client = cast("ClientStats", figures["client"])
    reasons = ", ".join(f"{reason}: {n} batches" for reason, n in sorted(client.fallback_reasons.items()))
    lines = [
        "",
        "udfserve demo report",
        "--------------------",
        f"rows scored            {options.rows:,} through remote_predict('{options.model}'), "
        + ("an Arrow UDF" if options.udf_type == "arrow" else "a pandas UDF"),
        f"time                   {seconds:.1f} s",
        f"throughput             {options.rows / seconds:,.0f} rows/s",
        f"answered by servers    {client.rows_by_server:,} rows in {client.batches_by_server:,} batches "
        f"(the servers' own metrics count {counted_by_servers:,})",
        f"answered by fallback   {client.rows_by_fallback:,} rows in {client.batches_by_fallback:,} batches"
        + (f" ({reasons})" if reasons else ""),
        f"payloads               {int(figures['shared_memory_requests']):,} of "  # type: ignore[call-overload]
        f"{client.batches_by_server:,} batches through the node's shared memory, the rest inline",
        f"resends                {client.retries:,} (RESOURCE_EXHAUSTED, or shared memory refused), "
        f"{client.backoff_s:.2f} s waited",
        f"model loads            {int(scrape_total(discovery, 'udfserve_model_loads_total', options.model))} "
        f"({len(discovery.servers)} server(s): "
        + ", ".join(f"{s.device} pid {s.pid}" for s in discovery.servers)
        + ")",
        "sample predictions     (class probabilities, first rows)",
    ]
    for row_id, values in figures["samples"]:  # type: ignore[attr-defined]
        lines.append(f"  id {row_id:<4} " + " ".join(f"{v:.3f}" for v in values))
    addresses = metrics_addresses(discovery)
    lines.append("metrics                " + ", ".join(f"http://{a}/metrics" for a in addresses))
    if discovery.metrics_targets_file:
        lines.append(f"prometheus targets     {discovery.metrics_targets_file}")
    return "\n".join(lines)


def run_demo(options: DemoOptions) -> str:
    ensure_example_models(options.model_repository, options.model)
    with contextlib.ExitStack() as stack:
        if options.start_node:
            discovery_file = stack.enter_context(running_node(options))
        else:
            discovery_file = options.discovery_file or default_discovery_path(os.environ)
            logger.info("step 2/4: using the running node of %s", discovery_file)
        discovery = read_discovery(discovery_file)
        figures = run_spark_job(options, discovery_file, discovery)
        text = report(options, discovery, figures)
        logger.info("step 4/4: stopping what the demo started")
    return text


def main(args: argparse.Namespace) -> int:
    try:
        text = run_demo(options_from_args(args))
    except DemoError as exc:
        logger.error("%s", exc)
        return 1
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0
