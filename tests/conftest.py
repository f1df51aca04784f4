"""Shared fixtures and tier markers.

Tiers follow folders: ``tests/unit`` (no sockets, no Spark), ``tests/backend`` (real
TensorFlow in-process), ``tests/integration`` and ``tests/node`` (real server processes),
``tests/spark`` (real PySpark), ``tests/deploy`` (deployment files checked against the code).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# grpcio 1.80 to 1.85 (grpc/grpc#43055): in a process whose gRPC channels are active, a child
# forked through subprocess's ``preexec_fn`` (PySpark starts its JVM that way) can die before it
# execs: the EventEngine's fork handling restarts a poller in the child, which then finds its
# epoll descriptor closed by ``close_fds``. The test process holds channels when the Spark fixture
# starts the JVM, and on a busy machine about one start in ten died (JAVA_GATEWAY_EXITED, with
# "epoll_wait error: Bad file descriptor" in the JVM's log). The gRPC experiment off here is that
# fork handling; set before any gRPC import, it reaches the servers this process starts too,
# none of which forks. docs/spark_client.md gives drivers the same advice.
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_fork")

_TIERS = {
    "unit": "unit",
    "backend": "integration",
    "integration": "integration",
    "node": "integration",
    "spark": "spark",
    "deploy": "integration",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = _TIERS.get(parts[0]) if len(parts) > 1 else None
        if tier:
            item.add_marker(getattr(pytest.mark, tier))


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


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example model repository, generated once per test session by the project's own command.

    Generated in a child process so that test processes which only talk to servers never
    import TensorFlow themselves.
    """
    root = tmp_path_factory.mktemp("model_repository")
    subprocess.run(
        [sys.executable, "-m", "services", "models", "generate", "--output", str(root), "--savedmodel"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root
