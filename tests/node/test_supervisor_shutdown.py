"""Stopping `udfserve node`, and a server that stays down while its back-off runs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from node_harness import NodeProcess, entry_for, pid_exists, stop_node


def test_sigterm_stops_every_server_removes_the_files_and_exits_0(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "sim:0,sim:1")
    try:
        discovery = node.wait_all_ready(2)
        server_pids = [s.pid for s in discovery.servers]
        assert all(pid is not None for pid in server_pids)

        exit_code = node.terminate()

        assert exit_code == 0, node.log()
        assert [pid for pid in server_pids if pid is not None and pid_exists(pid)] == []
        assert not node.discovery_path.exists()
        assert not node.targets_path.exists()
        for entry in discovery.servers:  # each server drained and exited 0 on its own
            assert f"model server on {entry.device} (pid {entry.pid}) exited with code 0" in node.log()
    finally:
        stop_node(node)


def test_a_dead_server_is_out_of_the_targets_and_not_ready_until_its_back_off_ends(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    hour = ["--restart-backoff-initial-s", "3600", "--restart-backoff-max-s", "3600"]
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "cpu", hour)
    try:
        ready = entry_for(node.wait_all_ready(1), "cpu")
        assert ready.device_index is None and ready.pid is not None

        os.kill(ready.pid, signal.SIGKILL)
        discovery = node.wait_for(
            lambda d: entry_for(d, "cpu").state == "restarting", "the cpu server marked restarting"
        )

        down = entry_for(discovery, "cpu")
        assert discovery.ready_servers() == []
        assert (down.pid, down.tcp_address, down.http_address, down.models) == (None, None, None, [])
        roles = [t["labels"]["role"] for t in json.loads(node.targets_path.read_text())]
        assert roles == ["supervisor"]
        # SIGTERM during the hour-long back-off stops the node at once
        assert node.terminate() == 0, node.log()
        assert not node.discovery_path.exists()
    finally:
        stop_node(node)


def test_a_discovery_file_that_cannot_be_written_stops_the_node_and_every_server(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    """A full or read-only disk, played by a folder where the file must go: the supervisor stops
    its servers and exits 1 instead of hanging on a server it never signalled."""
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "sim:0,sim:1")
    server_pids = [s.pid for s in node.wait_all_ready(2).servers]
    try:
        node.discovery_path.unlink()
        node.discovery_path.mkdir()
        first = server_pids[0]
        assert first is not None
        os.kill(first, signal.SIGKILL)  # its restart must be published, and cannot be
        assert node.process.wait(timeout=120) == 1, node.log()
        assert [pid for pid in server_pids if pid is not None and pid_exists(pid)] == [], node.log()
        assert "could not publish the servers as stopping" in node.log()
    finally:
        if node.process.poll() is None:
            node.process.kill()
        for pid in server_pids:
            if pid is not None and pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
