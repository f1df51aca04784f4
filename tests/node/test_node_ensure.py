"""What a Spark task does on its host to make sure a node runs (``spark_client/nodes/node_ensure.py``),
without Spark: the tasks are processes of their own, the node a real detached ``udfserve node``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from node_harness import START_TIMEOUT_S, wait_until

from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.nodes.host_start import wait_until_serving
from udfserve.spark_client.nodes.node_ensure import HostCheck, ensure_for_task, process_alive
from udfserve.spark_client.nodes.node_lease import LeaseHolder

TASKS = 4

TASK_PROCESS = """
import json, os, sys
from udfserve.spark_client.nodes.node_ensure import ensure_node
from udfserve.spark_client.common.node_start import NodeStart
start = NodeStart.from_json(sys.argv[1])
sys.stdin.read()  # every task waits for the word, then all go at once
check = ensure_node(start, os.environ, lock_wait_s=60)
print(json.dumps({"action": check.action, "pid": check.pid, "me": os.getpid(), "sid": os.getsid(0)}))
"""


@dataclass
class Started:
    start: NodeStart
    runtime_dir: Path
    checks: list[dict[str, object]]
    supervisor: psutil.Process


def node_start(holder: LeaseHolder, repository: Path, runtime_dir: Path) -> NodeStart:
    return NodeStart(
        model_repository=str(repository),
        devices="cpu",
        models=("tabular_mlp",),
        runtime_dir=str(runtime_dir),
        lease=holder.lease,
        lease_poll_s=0.5,
        lease_timeout_s=3.0,
    )


def supervisors(runtime_dir: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = process.info["cmdline"] or []
        alive = process.info["status"] != psutil.STATUS_ZOMBIE
        if alive and command[1:4] == ["-m", "udfserve", "node"] and str(runtime_dir) in command:
            found.append(process)
    return found


@pytest.fixture(scope="module")
def started(tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """Four tasks of one host, each a process of its own, ensure the node at the same moment."""
    runtime_dir = tmp_path_factory.mktemp("ensure") / "rt"
    holder = LeaseHolder("127.0.0.1", "127.0.0.1", application="app-ensure")
    start = node_start(holder, tabular_onnx_repository, runtime_dir)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("UDFSERVE_")}
    tasks = [
        subprocess.Popen(
            [sys.executable, "-c", TASK_PROCESS, start.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
        )
        for _ in range(TASKS)
    ]
    outputs = [task.communicate(b"go", timeout=120)[0] for task in tasks]
    checks = [json.loads(output) for output in outputs]
    try:
        [supervisor] = supervisors(runtime_dir)
        found = HostCheck(runtime_dir, runtime_dir / "discovery.json", "running", supervisor.pid)
        wait_until_serving(start, found, START_TIMEOUT_S)
        yield Started(start, runtime_dir, checks, supervisor)
    finally:
        holder.release(wait_s=10)
        for process in supervisors(runtime_dir):
            wait_until(lambda p=process: not process_alive(p.pid), 60, f"node pid {process.pid} to exit")


def test_the_tasks_of_one_host_start_one_node_and_all_name_it(started: Started) -> None:
    actions = sorted(str(check["action"]) for check in started.checks)
    assert actions == ["running"] * (TASKS - 1) + ["started"]
    assert {check["pid"] for check in started.checks} == {started.supervisor.pid}
    assert supervisors(started.runtime_dir) == [started.supervisor]


def test_the_node_outlives_the_task_that_started_it_in_a_session_of_its_own(started: Started) -> None:
    """The starting task has exited; the node runs on, in its own session, not the task's child,
    its input /dev/null and its output in the runtime folder's log."""
    [starter] = [check for check in started.checks if check["action"] == "started"]
    assert not process_alive(int(starter["me"]))  # type: ignore[call-overload]
    supervisor = started.supervisor
    assert supervisor.is_running()
    assert os.getsid(supervisor.pid) == supervisor.pid != starter["sid"]
    assert supervisor.ppid() != starter["me"]
    assert os.readlink(f"/proc/{supervisor.pid}/fd/0") == os.devnull
    assert Path(os.readlink(f"/proc/{supervisor.pid}/fd/1")) == started.runtime_dir / "logs" / "node.log"


def test_a_task_starts_no_node_for_a_context_that_has_ended(
    tabular_onnx_repository: Path, tmp_path: Path
) -> None:
    """A UDF used after its context ended: its holder no longer answers, and the task starts no
    node (one would only wait for the lease's timeout and stop)."""
    holder = LeaseHolder("127.0.0.1", "127.0.0.1", application="app-ended")
    holder.release(wait_s=0)
    runtime_dir = tmp_path / "rt"
    check = ensure_for_task(node_start(holder, tabular_onnx_repository, runtime_dir), os.environ)
    assert check is not None and check.action == "unreachable"
    assert supervisors(runtime_dir) == []
