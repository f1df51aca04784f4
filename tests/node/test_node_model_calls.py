"""A node whose servers change their models on a call (``--model-control explicit``): ``udfserve
models load|unload|index`` make the call on every device of the node, one after the other."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_harness import NodeProcess, predict_tabular, stop_node

MODEL = "tabular_mlp"
CALL_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def explicit_node(example_repository: Path) -> Iterator[tuple[NodeProcess, Path]]:
    """A node on sim:0 and sim:1 with explicit model control, on a copy of the example model."""
    root = Path(tempfile.mkdtemp(prefix="udfe-"))
    repository = root / "models"
    shutil.copytree(example_repository / MODEL, repository / MODEL)
    node = NodeProcess(root / "rt", repository, "sim:0,sim:1", ["--model-control", "explicit"])
    try:
        node.wait_all_ready(2)
        yield node, repository
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def models_command(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "udfserve", "models", *args, "--discovery-file", str(node.discovery_path)],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT_S,
    )


@pytest.mark.slow
def test_a_load_through_the_node_reaches_every_device_and_the_discovery_file(
    explicit_node: tuple[NodeProcess, Path],
) -> None:
    node, repository = explicit_node
    shutil.copytree(repository / MODEL / "1", repository / MODEL / "2")

    loaded = models_command(node, "load", MODEL)

    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines() == [
        f"sim:0: {MODEL} serves version(s) [2]",
        f"sim:1: {MODEL} serves version(s) [2]",
    ]
    discovery = node.discovery()
    assert discovery is not None
    for server in discovery.servers:
        assert server.unix_socket is not None
        assert predict_tabular(server.unix_socket).model_version == 2, server.device
    node.wait_for(
        lambda discovery: all(s.versions == {MODEL: [2]} for s in discovery.servers),
        "both devices listing version 2 in the discovery file",
    )


def test_the_index_through_the_node_lists_each_devices_versions(
    explicit_node: tuple[NodeProcess, Path],
) -> None:
    node, _ = explicit_node

    index = models_command(node, "index", "--ready-only")

    assert index.returncode == 0, index.stderr
    lines = index.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["sim:0", "sim:1"]
    assert all(f"{MODEL} " in line and "READY" in line for line in lines), lines


def test_a_load_of_a_model_not_in_the_repository_fails_on_every_device_naming_them(
    explicit_node: tuple[NodeProcess, Path],
) -> None:
    node, _ = explicit_node

    loaded = models_command(node, "load", "absent_model")

    assert loaded.returncode == 1
    assert all("FAILED NOT_FOUND" in line for line in loaded.stdout.splitlines()), loaded.stdout
    assert "failed on 2 of 2 device(s): sim:0, sim:1" in loaded.stderr


def test_a_node_call_without_a_running_node_says_where_it_looked(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "udfserve",
            "models",
            "index",
            "--discovery-file",
            str(tmp_path / "none.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2
    assert str(tmp_path / "none.json") in result.stderr
