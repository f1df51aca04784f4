"""Real ``udfserve node`` processes serving the example tabular model (its ONNX graph, so that a
node's servers start without TensorFlow's import) on simulated devices."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_harness import NodeProcess, stop_node


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths are limited to about 100 bytes: pytest's tmp paths can be longer
    path = Path(tempfile.mkdtemp(prefix="udfn-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def two_device_node(tabular_onnx_repository: Path) -> Iterator[NodeProcess]:
    """A node with simulated devices sim:0 and sim:1, every server ready, restarting quickly."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(
        root / "rt", tabular_onnx_repository, "sim:0,sim:1", ["--restart-backoff-initial-s", "0.2"]
    )
    try:
        node.wait_all_ready(2)
        yield node
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
