"""``udfserve node --leases``: a node that runs while some application holds a lease on it.

Each lease's holder is a real endpoint (``udfserve.spark_client.nodes.node_lease.LeaseHolder``, what a
driver serves), in this process or, to be killed, in a process of its own; the node is a real
``udfserve node`` process reading the lease files in its runtime folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_harness import NodeProcess, http_get, pid_exists, stop_node, wait_until

from udfserve.node_files import trusted_uids
from udfserve.node_leases import Lease, write_lease
from udfserve.spark_client.nodes.node_lease import LeaseHolder

POLL_S = 0.5
TIMEOUT_S = 3.0
LEASE_FLAGS = ["--leases", "--lease-poll-s", str(POLL_S), "--lease-timeout-s", str(TIMEOUT_S)]
EXIT_WAIT_S = 60.0


def hold(runtime_dir: Path, lease: Lease) -> None:
    """What an application's task does on the host before it starts the node: write its lease."""
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    write_lease(runtime_dir, lease, frozenset({os.geteuid()}), trusted_uids())


def held_leases(node: NodeProcess) -> list[str]:
    """The leases the node lists as held or awaiting an answer (its readiness probe's body)."""
    _, body = http_get(node.supervisor_http_address(), "/health/ready")
    return [lease["lease_id"] for lease in json.loads(body)["leases"]]


@pytest.fixture
def holders() -> Iterator[list[LeaseHolder]]:
    made: list[LeaseHolder] = []
    yield made
    for holder in made:
        holder.release(wait_s=0)


def test_a_node_stays_while_any_lease_is_held_and_exits_once_the_last_is_released(
    short_dir: Path, tabular_onnx_repository: Path, holders: list[LeaseHolder]
) -> None:
    first = LeaseHolder("127.0.0.1", "127.0.0.1", application="app-first")
    second = LeaseHolder("127.0.0.1", "127.0.0.1", application="app-second")
    holders += [first, second]
    runtime_dir = short_dir / "rt"
    hold(runtime_dir, first.lease)
    hold(runtime_dir, second.lease)
    node = NodeProcess(runtime_dir, tabular_onnx_repository, "cpu", LEASE_FLAGS)
    try:
        discovery = node.wait_all_ready(1)

        first.release(wait_s=EXIT_WAIT_S)
        wait_until(
            lambda: held_leases(node) == [second.lease.lease_id], EXIT_WAIT_S, "the first lease dropped"
        )
        assert node.process.poll() is None
        assert not (runtime_dir / "leases" / f"{first.lease.lease_id}.json").exists()

        second.release(wait_s=EXIT_WAIT_S)
        assert node.process.wait(timeout=EXIT_WAIT_S) == 0
        assert not any(pid_exists(s.pid) for s in discovery.servers if s.pid is not None)
        assert not node.discovery_path.exists()
    finally:
        stop_node(node)


HOLDER_PROCESS = """
import sys
from udfserve.spark_client.nodes.node_lease import LeaseHolder
holder = LeaseHolder("127.0.0.1", "127.0.0.1", application="app-killed")
print(holder.lease.to_json(), flush=True)
sys.stdin.read()
"""


def test_a_node_whose_only_holder_was_killed_exits_after_the_lease_timeout(
    short_dir: Path, tabular_onnx_repository: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_PROCESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        lease = Lease.from_json(holder.stdout.readline())
        runtime_dir = short_dir / "rt"
        hold(runtime_dir, lease)
        node = NodeProcess(runtime_dir, tabular_onnx_repository, "cpu", LEASE_FLAGS)
        try:
            node.wait_all_ready(1)
            holder.kill()
            assert node.process.wait(timeout=TIMEOUT_S + EXIT_WAIT_S) == 0
            assert "its holder has not answered for 3 s" in node.log()
        finally:
            stop_node(node)
    finally:
        holder.kill()
        holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()


def test_a_leased_node_with_no_lease_file_exits_at_once(
    short_dir: Path, tabular_onnx_repository: Path
) -> None:
    """Nothing holds it: started by hand with --leases and no lease, it stops at its first poll."""
    runtime_dir = short_dir / "rt"
    runtime_dir.mkdir(mode=0o700)
    node = NodeProcess(runtime_dir, tabular_onnx_repository, "cpu", LEASE_FLAGS)
    try:
        assert node.process.wait(timeout=EXIT_WAIT_S) == 0
        assert "no application holds a lease on this node" in node.log()
    finally:
        stop_node(node)
