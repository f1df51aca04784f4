"""``udfserve doctor`` on a node that is broken for real: its supervisor stopped (the heartbeat goes
stale), its supervisor killed (the node's lock is free, its servers drain away), a server that
cannot start, a version loaded on one device only. Each test runs its own node, as each breaks it
for good."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import grpc
import pytest
from doctor_harness import run_doctor
from node_harness import NodeProcess, kill_if_still_running, stop_node, wait_until

from udfserve.discovery import read_discovery
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc

QUICK = "--no-import-frameworks"
STALE_TIMEOUT_S = 60.0  # far beyond the 1 s after which the node below says its file is stale
SERVERS_GONE_TIMEOUT_S = 120.0  # a server drains (grace period 5 s) and tears TensorFlow down
LOAD_TIMEOUT_S = 600.0  # a version loaded and warmed up on a busy machine


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.mark.slow
def test_a_stopped_supervisor_leaves_a_stale_heartbeat_and_says_how_to_resume_it(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    heartbeat = ["--discovery-heartbeat-s", "0.5", "--discovery-stale-after-s", "1"]
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "sim:0", heartbeat)
    try:
        node.wait_all_ready(1)
        os.kill(node.pid, signal.SIGSTOP)
        wait_until(
            lambda: read_discovery(node.discovery_path).is_stale(time.time()),
            STALE_TIMEOUT_S,
            "the discovery file of the stopped supervisor to go stale",
        )

        run = run_doctor("stale-heartbeat", ["--runtime-dir", str(node.runtime_dir), QUICK])
    finally:
        os.kill(node.pid, signal.SIGCONT)
        stop_node(node)

    assert run.code == 1
    heartbeat_line = run.line_of("heartbeat")
    assert heartbeat_line.startswith("FAIL  heartbeat: stale: written ")
    assert "clients take a file older than 1 s for absent" in heartbeat_line
    assert f"fix: the supervisor (pid {node.pid}) is stopped: `kill -CONT {node.pid}`" in heartbeat_line
    supervisor_line = run.line_of("supervisor")
    assert supervisor_line.startswith(
        f"FAIL  supervisor: pid {node.pid} holds the node's lock but is stopped"
    )


@pytest.mark.slow
def test_a_killed_supervisor_is_found_gone_by_its_free_lock_while_its_file_is_fresh(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    fresh_for_long = ["--discovery-stale-after-s", "600"]  # the file alone would still look live
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "sim:0", fresh_for_long)
    server_pids: list[int] = []
    try:
        discovery = node.wait_all_ready(1)
        server_pids = [s.pid for s in discovery.servers if s.pid is not None]
        node.process.kill()
        node.process.wait(timeout=60)
        wait_until(
            lambda: all(gone(pid) for pid in server_pids),
            SERVERS_GONE_TIMEOUT_S,
            f"servers {server_pids} of the killed supervisor to exit",
        )

        run = run_doctor("dead-supervisor", ["--runtime-dir", str(node.runtime_dir), QUICK])
    finally:
        for pid in server_pids:
            kill_if_still_running(pid, node.runtime_dir)

    assert run.code == 1
    assert run.line_of("heartbeat").startswith("ok    heartbeat: written ")
    supervisor_line = run.line_of("supervisor")
    lock = node.runtime_dir / "node.lock"
    assert supervisor_line.startswith(
        f"FAIL  supervisor: no process holds the node's lock {lock}: the supervisor that wrote the file "
        f"(pid {node.pid}) is gone, and no process has pid {node.pid}"
    )
    assert "fix: start the node again" in supervisor_line
    server_line = run.line_of("sim:0")
    assert server_line.startswith("FAIL  sim:0: listed ready, but its health check is not answered")
    assert "is missing; the client falls back to its TCP port" in run.section("Unix sockets")


def test_a_server_that_cannot_start_is_reported_with_the_reason_and_its_log(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    model_folder = tabular_onnx_repository / "tabular_mlp"  # a model's own folder given as the repository
    hour = ["--restart-backoff-initial-s", "3600", "--restart-backoff-max-s", "3600"]
    node = NodeProcess(short_dir / "rt", model_folder, "sim:0", hour)
    try:
        node.wait_for(lambda d: bool(d.servers and d.servers[0].problem), "a problem of sim:0")

        run = run_doctor("server-not-ready", ["--runtime-dir", str(node.runtime_dir), QUICK])
    finally:
        stop_node(node)

    assert run.code == 1
    line = run.line_of("sim:0")
    assert line.startswith("FAIL  sim:0: restarting: server pid ")
    assert f"serves no model: model repository {model_folder} holds no servable model" in line
    assert f"its parent {tabular_onnx_repository} is probably the repository" in line
    assert f"fix: its log: {node.runtime_dir / 'logs' / 'server-sim0.log'}" in line
    assert "Not healthy: 1 problem blocks jobs (sim:0)" in run.output


@pytest.mark.slow
def test_a_version_loaded_on_one_device_only_is_reported_with_each_devices_versions(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    repository = short_dir / "models"
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    node = NodeProcess(short_dir / "rt", repository, "sim:0,sim:1", ["--model-control", "explicit"])
    try:
        discovery = node.wait_all_ready(2)
        shutil.copytree(repository / "tabular_mlp" / "1", repository / "tabular_mlp" / "2")
        [first] = [s for s in discovery.servers if s.device == "sim:0"]
        with grpc.insecure_channel(f"unix://{first.unix_socket}") as channel:  # one device, not the node
            loaded = pb_grpc.InferenceStub(channel).LoadModel(
                pb.LoadModelRequest(model="tabular_mlp"), timeout=LOAD_TIMEOUT_S
            )
        assert list(loaded.served_versions) == [2]

        run = run_doctor("versions-differ", ["--runtime-dir", str(node.runtime_dir), QUICK])
    finally:
        stop_node(node)

    assert run.code == 0  # each device serves: jobs run, but which version answers depends on the device
    line = run.line_of("tabular_mlp versions")
    assert line.startswith(
        "WARN  tabular_mlp versions: the devices serve different versions (sim:0: 2; sim:1: 1)"
    )
    assert "fix: wait for the rollout to finish, or load the version on every device" in line
    assert run.line_of("sim:0").startswith("ok    sim:0: health SERVING")
    assert "serves tabular_mlp version 2 (and 1, leased to the jobs that pinned it)" in run.line_of("sim:0")
