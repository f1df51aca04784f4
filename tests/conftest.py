"""Shared fixtures and tier markers.

Tiers follow folders: ``tests/unit`` (no sockets, no Spark), ``tests/backend`` (real
TensorFlow in-process), ``tests/integration`` and ``tests/node`` (real server processes),
``tests/spark`` (real PySpark), ``tests/spark_connect`` (real PySpark through a Spark Connect
session), ``tests/deploy`` (deployment files checked against the code).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


_TIERS = {
    "unit": "unit",
    "backend": "integration",
    "integration": "integration",
    "node": "integration",
    "spark": "spark",
    "spark_connect": "spark_connect",
    "deploy": "integration",
}

CONNECT_FIXTURE = "connect_spark"
"""The Spark Connect session of tests/spark_connect, which stops the classic ``spark`` session."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = _TIERS.get(parts[0]) if len(parts) > 1 else None
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=run_order(items))


_TIER_ORDER = {"spark": 0, "integration": 1, "node": 1, "backend": 1, "deploy": 1, "unit": 2}
"""Which tiers start first. scripts/test.sh hands whole modules to parallel worker processes in
this order (``--dist loadfile --no-loadscope-reorder``): the long ones first, so that the many
short unit tests fill the workers' last minutes instead of one Spark module running alone."""


def run_order(items: list[pytest.Item]) -> Callable[[pytest.Item], tuple[int, int]]:
    """The sort key of the session's tests. A Spark Connect session cannot share the process with
    the classic session, which it stops (tests/spark_connect/conftest.py): every module with a test
    that uses it runs after every other module, whole (a worker process is given whole modules),
    so that no classic Spark test runs in a process after it."""
    connect_modules = {item.path for item in items if CONNECT_FIXTURE in getattr(item, "fixturenames", ())}

    def key(item: pytest.Item) -> tuple[int, int]:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = _TIER_ORDER.get(parts[0], 1) if len(parts) > 1 else 1
        return (item.path in connect_modules, tier)

    return key


@pytest.fixture(scope="session", autouse=True)
def spark_uses_this_interpreter() -> Iterator[None]:
    """PySpark starts its Python workers with PYSPARK_PYTHON (else the first python3 on PATH) and
    its launcher scripts with python3 from PATH, whatever the Spark conf says: point both at the
    interpreter running the tests, so an unactivated virtual environment works too."""
    interpreter_dir = str(Path(sys.executable).parent)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
        patch.setenv("PYSPARK_DRIVER_PYTHON", os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable))
        patch.setenv("PATH", interpreter_dir + os.pathsep + os.environ.get("PATH", ""))
        yield


ONNX_EXPORT = "tabular_mlp_onnx"
"""The folder ``models generate --onnx`` writes ``tabular_mlp``'s ONNX graph to."""


@pytest.fixture(scope="session")
def generated_repositories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The example model repository and a repository of ``tabular_mlp``'s ONNX graph alone, both
    written once per test session by one run of the project's own command.

    Generated in a child process so that test processes which only talk to servers never
    import TensorFlow themselves.
    """
    root = tmp_path_factory.mktemp("model_repository")
    command = [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(root)]
    subprocess.run([*command, "--savedmodel", "--onnx"], check=True, capture_output=True, timeout=300)
    onnx_root = tmp_path_factory.mktemp("tabular_onnx_repository")
    shutil.move(root / ONNX_EXPORT, onnx_root / "tabular_mlp")
    config = onnx_root / "tabular_mlp" / "config.yaml"
    config.write_text(config.read_text().replace(f"name: {ONNX_EXPORT}", "name: tabular_mlp"))
    return root, onnx_root


@pytest.fixture(scope="session")
def example_repository(generated_repositories: tuple[Path, Path]) -> Path:
    """The example model repository (``models generate --savedmodel``): TensorFlow models."""
    return generated_repositories[0]


@pytest.fixture(scope="session")
def tabular_onnx_repository(generated_repositories: tuple[Path, Path]) -> Path:
    """A repository of one model, ``tabular_mlp``, as the ONNX graph of the example's weights
    (``models generate --onnx``; its answers equal the Keras model's to 1e-5).

    For the tests of what a server, a node or the client does around a model, not of TensorFlow:
    its server starts without importing TensorFlow (about 5 CPU-seconds, 20 s of a start on a
    loaded machine) and a CPU fallback runs ONNX Runtime, so the suite spends its time on what
    it tests.
    """
    return generated_repositories[1]


def published_version_2(repository: Path, scratch: Path) -> Path:
    """Version 2 of ``repository``'s ``tabular_mlp``, in its format, with other weights than
    version 1 (so its predictions differ), written by ``models generate --publish-version 2`` into
    a copy in ``scratch``: kept aside for tests to publish."""
    shutil.copytree(repository / "tabular_mlp", scratch / "tabular_mlp")
    command = [sys.executable, "-m", "udfserve", "models", "generate", "--output", str(scratch)]
    subprocess.run(
        [*command, "--publish-version", "2", "--only", "tabular_mlp"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return scratch / "tabular_mlp" / "2"


@pytest.fixture(scope="session")
def tabular_version_2(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Version 2 of the example ``tabular_mlp`` (Keras)."""
    return published_version_2(example_repository, tmp_path_factory.mktemp("tabular_version_2"))


@pytest.fixture(scope="session")
def tabular_onnx_version_2(tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Version 2 of ``tabular_onnx_repository``'s ``tabular_mlp`` (an ONNX graph)."""
    return published_version_2(tabular_onnx_repository, tmp_path_factory.mktemp("tabular_onnx_version_2"))


# -- one local-mode SparkSession for every Spark test ----------------------------------------------
# Its Python workers are reused across tasks (``spark.python.worker.reuse=true``, Spark's default and
# what jobs run with), but not across test modules: Spark keeps one pool of Python workers per
# environment of the UDFs, so each module's UDFs carry an environment variable naming the module
# (``python_workers_of_the_module``), and a module's tasks never run in a worker that another
# module's test left with TensorFlow imported by a CPU fallback, or with a warning already logged.
# A fresh worker per task (reuse off) cost 1-1.5 s of imports for every task of the tier. The
# JVM's stderr, which carries the Python workers' stderr and so the client's warnings, goes to a
# log file the tests read.

WORKER_POOL_VARIABLE = "UDFSERVE_TEST_WORKER_POOL"
"""The environment variable whose value (the test module's name) keys the Python workers' pool."""


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
        .config("spark.python.worker.reuse", "true")
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


@pytest.fixture(scope="session", autouse=True)
def spark_started_before_any_channel(request: pytest.FixtureRequest) -> None:
    """Start the shared SparkSession before the first test, when a selected test uses it.

    PySpark starts its JVM as a child forked with ``preexec_fn``. With grpcio 1.80 to 1.85
    (grpc/grpc#43055) such a child of a process whose gRPC channels are active can die before it
    execs (its log: ``epoll_wait error: Bad file descriptor``; the fixture: JAVA_GATEWAY_EXITED),
    and by the Spark tests this process has talked to many servers: on a busy machine every Spark
    test then failed at setup in about one run in three. Before the first test no channel exists.
    """
    if any("spark" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("spark")


@pytest.fixture(autouse=True)
def process_logging_restored() -> Iterator[None]:
    """Undo what a command run in the test process (``udfserve doctor``, the CLI's entry points:
    ``process_setup.configure_logging``) did to the process's logging: its root handler, level,
    warnings capture and exception hooks would otherwise stay for every later test of the process,
    which then depends on the order its tests run in (a handler's traceback budget, for one)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    excepthook, thread_excepthook = sys.excepthook, threading.excepthook
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    sys.excepthook, threading.excepthook = excepthook, thread_excepthook


@pytest.fixture(autouse=True)
def python_workers_of_the_module(request: pytest.FixtureRequest) -> None:
    """Give the UDFs a test of this module creates the module's own pool of Python workers.

    PySpark copies ``SparkContext.environment`` into each UDF it wraps, and Spark starts a separate
    daemon, and so separate workers, for each distinct environment.
    """
    if "spark" not in request.fixturenames:
        return
    session = request.getfixturevalue("spark")
    session.sparkContext.environment[WORKER_POOL_VARIABLE] = request.module.__name__


@pytest.fixture
def fresh_python_workers(python_workers_of_the_module: None, request: pytest.FixtureRequest) -> None:
    """Give the UDFs this test creates a pool of Python workers of their own, never used before: for
    a test about what a worker imports, which an earlier test of its module could have imported."""
    session = request.getfixturevalue("spark")
    session.sparkContext.environment[WORKER_POOL_VARIABLE] = request.node.nodeid
