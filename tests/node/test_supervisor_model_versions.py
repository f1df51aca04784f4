"""A node whose servers watch the repository (``--model-control poll``): each device's versions
are in the discovery file and the supervisor's ``/health/ready``, and a version published in the
repository reaches every device by itself."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from node_harness import NodeProcess, http_get, predict_tabular, stop_node

from udfserve.discovery import NodeDiscovery

MODEL = "tabular_mlp"


@pytest.fixture(scope="module")
def polling_node(example_repository: Path) -> Iterator[tuple[NodeProcess, Path]]:
    """A node on sim:0 and sim:1 polling a copy of the example model every half second, and that
    copy. Short poll and settle times, so that a publish is taken up within seconds."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    repository = root / "models"
    shutil.copytree(example_repository / MODEL, repository / MODEL)
    node = NodeProcess(
        root / "rt",
        repository,
        "sim:0,sim:1",
        ["--model-control", "poll", "--repository-poll-s", "0.5", "--repository-settle-s", "1"],
    )
    try:
        node.wait_all_ready(2)
        yield node, repository
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def publish(model_folder: Path, from_version: int, version: int) -> None:
    """The documented atomic publish: copy to a hidden name in the model's folder, then rename."""
    staging = model_folder / f".{version}.publishing"
    shutil.copytree(model_folder / str(from_version), staging)
    staging.rename(model_folder / str(version))


def every_device_serves(version: int) -> Callable[[NodeDiscovery], bool]:
    def check(discovery: NodeDiscovery) -> bool:
        servers = discovery.servers
        return len(servers) == 2 and all(version in s.versions.get(MODEL, []) for s in servers)

    return check


def test_the_supervisors_health_shows_each_devices_versions_as_the_discovery_file_does(
    polling_node: tuple[NodeProcess, Path],
) -> None:
    node, _ = polling_node
    discovery = node.wait_all_ready(2)

    status, body = http_get(node.supervisor_http_address(), "/health/ready")

    assert status == 200, body
    assert json.loads(body)["versions"] == {s.device: s.versions for s in discovery.servers}
    assert all(s.versions.get(MODEL) for s in discovery.servers), discovery.servers


@pytest.mark.slow
def test_a_version_published_in_the_repository_reaches_every_device(
    polling_node: tuple[NodeProcess, Path],
) -> None:
    node, repository = polling_node
    before = node.wait_all_ready(2)
    assert all(s.versions == {MODEL: [1]} for s in before.servers), before.servers

    publish(repository / MODEL, from_version=1, version=2)
    after = node.wait_for(every_device_serves(2), f"both devices listing {MODEL} version 2")

    for server in after.servers:
        assert server.unix_socket is not None
        assert predict_tabular(server.unix_socket).model_version == 2, server.device
