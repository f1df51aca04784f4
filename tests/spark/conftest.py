"""One local-mode SparkSession for every Spark test, real model servers, and reference outputs.

The session's Python workers are not reused across tasks (``spark.python.worker.reuse=false``):
a worker that ran the CPU fallback in one test keeps TensorFlow imported, and the test proving
that the happy path never imports it must see a fresh worker. The JVM's stderr, which carries
the Python workers' stderr and so the client's warnings, goes to a log file the tests read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.model_server.launcher import ServerProcess, launch_server


@pytest.fixture(scope="session")
def spark_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark") / "jvm-stderr.log"


@pytest.fixture(scope="session")
def spark(spark_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from pyspark.sql import SparkSession

    runtime_dir = tmp_path_factory.mktemp(
        "udfserve-runtime"
    )  # no node discovery file unless a test writes one
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-spark-client-tests")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.executorEnv.UDFSERVE_RUNTIME_DIR", str(runtime_dir))
    )
    saved_stderr = os.dup(2)
    try:
        with open(spark_log, "ab") as log:
            os.dup2(log.fileno(), 2)  # the JVM inherits it at launch; this process gets its own back
        session = builder.getOrCreate()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def server(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A model server of the example repository, on a unix socket and loopback TCP."""
    folder = tmp_path_factory.mktemp("server")
    process = launch_server(
        example_repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )
    yield process
    process.terminate()


THROTTLED_ITERATIONS = 200
"""Loop iterations of the throttled server's model: about a third of a second per 1,000 rows."""

THROTTLED_CONFIG = """\
max_batch_size: 4096
warmup: false
dynamic_batching:
  max_queue_delay_s: 0.002
  max_queue_rows: 1000
"""


@pytest.fixture(scope="module")
def throttled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose queue is full while a call runs: a genuinely slow model (``slow_model.py``)
    behind a queue of one 1,000-row request, so that of a window of several such requests one
    runs, one waits, and the others are refused until the call ends (a third of a second)."""
    import subprocess

    root = tmp_path_factory.mktemp("throttled")
    slow_model = Path(__file__).with_name("slow_model.py")
    subprocess.run(
        [sys.executable, str(slow_model), str(root / "repository"), str(THROTTLED_ITERATIONS)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (root / "repository" / "slow_sum" / "config.yaml").write_text(THROTTLED_CONFIG)
    process = launch_server(
        root / "repository", socket=root / "grpc.sock", port=None, http_port=0, log_path=root / "server.log"
    )
    yield process
    process.terminate()
