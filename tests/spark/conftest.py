"""Real model servers and reference outputs for the Spark tests (the SparkSession they share is
started in tests/conftest.py, before any test opens a gRPC channel)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from udfserve.services.model_server.launcher import ServerProcess, launch_server


@pytest.fixture(scope="session")
def server(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A model server of the example repository, on a unix socket and loopback TCP, shared by every
    module that asks for it (a start costs seconds): its users stop, signal or reconfigure none of
    it, and read its counters as deltas and its log for lines of their own job."""
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


def slow_server(folder: Path, extra_args: list[str]) -> ServerProcess:
    """A server of a genuinely slow model (``slow_model.py``) behind a queue of one 1,000-row request."""
    import subprocess

    slow_model = Path(__file__).with_name("slow_model.py")
    subprocess.run(
        [sys.executable, str(slow_model), str(folder / "repository"), str(THROTTLED_ITERATIONS)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (folder / "repository" / "slow_sum" / "config.yaml").write_text(THROTTLED_CONFIG)
    return launch_server(
        folder / "repository",
        socket=folder / "grpc.sock",
        port=None,
        http_port=0,
        log_path=folder / "server.log",
        extra_args=extra_args,
    )


@pytest.fixture(scope="module")
def throttled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose queue is full while a call runs, refusing what does not fit
    (``--room-wait-s 0``): of a window of several 1,000-row requests one runs, one waits, and the
    others are refused until the call ends (a third of a second)."""
    process = slow_server(tmp_path_factory.mktemp("throttled"), ["--room-wait-s", "0"])
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def holding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same slow model and queue, served as by default: a stream's request that does not fit
    waits in the server for room (``--room-wait-s``), and its stream is read no further meanwhile."""
    process = slow_server(tmp_path_factory.mktemp("holding"), [])
    yield process
    process.terminate()
