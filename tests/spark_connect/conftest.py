"""One Spark Connect session for the folder, and the real model servers its tests call.

A Spark Connect session and the suite's classic SparkSession (tests/conftest.py) cannot be alive
in one process at once. ``SparkSession.builder.remote("local[2]")`` starts its Connect server as
a classic SparkContext in the calling process (the one SparkContext a process may hold), and
refuses with SESSION_ALREADY_EXIST while another is active; and once a Connect session exists,
PySpark sets ``SPARK_CONNECT_MODE_ENABLED`` in the process's environment, which turns
``pyspark.sql.functions``, the UDF factories and ``SparkSession.getActiveSession`` into their
Connect versions for every caller in the process. One after the other they work: the classic
session is stopped, and the local Connect server starts a SparkContext in the same JVM (a second
or so, no new JVM). So the Connect tests run after every other test (tests/conftest.py moves
them last), and ``connect_spark`` stops the classic session before it starts.

``connect_spark`` asks for the classic ``spark`` fixture for the JVM it leaves behind: it is then
started before any test opens a gRPC channel (the reason is in tests/conftest.py), with its
stderr, and so the Python workers' warnings, in ``spark_log``, also when only this folder runs.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from udfserve.services.model_server.launcher import ServerProcess, launch_server


@pytest.fixture(scope="session")
def connect_spark(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A Spark Connect session of a local Connect server (``remote("local[2]")``), started once the
    classic session has stopped. tests/conftest.py runs the tests that use it (its
    ``CONNECT_FIXTURE``) after every other test.

    ``SPARK_TESTING`` is set while the session starts, and only then: it is how PySpark's local
    Connect server takes an ephemeral port and its client reads that port back, where it would
    otherwise bind 15002 and collide with any other run on the machine. The JVM was started by the
    classic session, so it never sees the variable.
    """
    spark.stop()
    runtime_dir = tmp_path_factory.mktemp("udfserve-runtime-connect")  # no node discovery file
    builder = (
        SparkSession.builder.remote("local[2]")
        .appName("udfserve-spark-connect-tests")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.UDFSERVE_RUNTIME_DIR", str(runtime_dir))
        # Spark's default, which the classic session turns off: a Python worker that loaded the
        # model for the CPU fallback keeps it for the next task instead of importing TensorFlow again.
        .config("spark.python.worker.reuse", "true")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", str(uuid.uuid4()))  # removed again afterwards
        with pytest.MonkeyPatch.context() as starting:
            starting.setenv("SPARK_TESTING", "1")
            session = builder.getOrCreate()
        assert type(session).__module__ == "pyspark.sql.connect.session", type(session)
        yield session
        session.stop()  # stops the local Connect server and clears PySpark's Connect mode


def launch(repository: Path, folder: Path) -> ServerProcess:
    """A model server of ``repository`` on a unix socket and loopback TCP, its log in ``folder``."""
    return launch_server(
        repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )


@pytest.fixture(scope="session")
def server(
    tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A model server of the tabular model's ONNX graph, shared by the folder's tests that leave it
    running."""
    process = launch(tabular_onnx_repository, tmp_path_factory.mktemp("connect-server"))
    yield process
    process.terminate()


@pytest.fixture
def own_server(tabular_onnx_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the tabular model's ONNX graph for one test, which the test may kill."""
    process = launch(tabular_onnx_repository, tmp_path / "server")
    yield process
    process.kill()


@pytest.fixture(scope="session")
def versioned_repository(
    tabular_onnx_repository: Path, tabular_onnx_version_2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """``tabular_mlp``'s ONNX graph in versions 1 and 2 (other weights), under the policy
    ``latest: 1``: a server and the CPU fallback compute version 2, so a row saying 1 would be a
    wrong answer."""
    root = tmp_path_factory.mktemp("connect-versions") / "repository"
    model = tabular_onnx_repository / "tabular_mlp"
    shutil.copytree(model / "1", root / "tabular_mlp" / "1")
    shutil.copytree(tabular_onnx_version_2, root / "tabular_mlp" / "2")
    config = yaml.safe_load((model / "config.yaml").read_text())
    config["version_policy"] = {"latest": 1}
    (root / "tabular_mlp" / "config.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="session")
def versioned_server(
    versioned_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch(versioned_repository, tmp_path_factory.mktemp("connect-versioned-server"))
    yield process
    process.terminate()
