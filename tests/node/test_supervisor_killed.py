"""A supervisor killed with SIGKILL: its servers do not outlive it, and the discovery file of a
node killed whole (supervisor and servers) is taken for absent once its heartbeat is too old."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from node_harness import NodeProcess, kill_if_still_running, wait_until

from udfserve.discovery import read_discovery
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.nodes.routing import NoServerFound, TaskPlacement, resolve_route

ORPHAN_TIMEOUT_S = 120.0  # each server drains (grace period 5 s) and tears TensorFlow down on a busy machine
STALE_TIMEOUT_S = 60.0  # far beyond the 3 s bound the node below writes into its file


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_the_servers_of_a_supervisor_killed_with_sigkill_drain_and_exit(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "sim:0,sim:1")
    server_pids: list[int] = []
    try:
        discovery = node.wait_all_ready(2)
        server_pids = [s.pid for s in discovery.servers if s.pid is not None]
        assert len(server_pids) == 2

        node.process.kill()
        node.process.wait(timeout=60)

        wait_until(
            lambda: all(gone(pid) for pid in server_pids),
            ORPHAN_TIMEOUT_S,
            f"servers {server_pids} of the killed supervisor to exit",
        )
        # each drained rather than died: a drained server removes its own socket
        sockets = [s.unix_socket for s in discovery.servers if s.unix_socket]
        assert [path for path in sockets if Path(path).exists()] == []
    finally:
        for pid in server_pids:
            kill_if_still_running(pid, node.runtime_dir)


def test_the_discovery_file_of_a_node_killed_whole_is_taken_for_absent_once_its_heartbeat_is_stale(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    heartbeat = ["--discovery-heartbeat-s", "0.5", "--discovery-stale-after-s", "3"]
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "cpu", heartbeat)
    config = ClientConfig(discovery_file=str(node.discovery_path))
    pids: list[int] = []
    try:
        discovery = node.wait_all_ready(1)
        assert resolve_route(config, {}, TaskPlacement()).targets  # a live node's file routes
        pids = [node.pid, *(s.pid for s in discovery.servers if s.pid is not None)]

        for pid in pids:  # the whole node at once, the supervisor first: nobody rewrites the file
            os.kill(pid, signal.SIGKILL)
        node.process.wait(timeout=60)
        left = read_discovery(node.discovery_path)
        assert [s.device for s in left.ready_servers()] == ["cpu"]  # it still lists a dead ready server

        def refusal() -> str | None:
            try:
                resolve_route(config, {}, TaskPlacement())
            except NoServerFound as exc:
                return str(exc)
            return None

        message = wait_until(
            refusal, STALE_TIMEOUT_S, "the client's routing to take the stale file for absent"
        )
        assert f"discovery file {node.discovery_path} is stale" in message
        assert "older than 3.0 s is taken for absent" in message
    finally:
        node.process.kill()
        for pid in pids:
            kill_if_still_running(pid, node.runtime_dir)
