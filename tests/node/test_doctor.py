"""``udfserve doctor`` against a real node: healthy, then each problem of this host made real.

One node (one simulated device) serves the module; each test breaks one thing for real (a folder's
mode, a socket's mode, the interpreter Spark's workers would start, an environment missing a
framework, a full tmpfs), runs the real command, and puts it back. The node's own faults (its
supervisor stopped or killed, a server that cannot start) are in ``test_doctor_node_faults.py``,
the token's in ``test_doctor_token.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_harness import (
    as_user_of_file_modes,
    bare_environment,
    environment_without,
    in_another_pid_namespace,
    run_doctor,
)
from node_harness import NodeProcess, stop_node

QUICK = "--no-import-frameworks"


@pytest.fixture(scope="module")
def node(example_repository: Path) -> Iterator[NodeProcess]:
    root = Path(tempfile.mkdtemp(prefix="udfd-"))
    root.chmod(0o755)
    running = NodeProcess(root / "rt", example_repository, "sim:0")
    try:
        running.wait_all_ready(1)
        yield running
    finally:
        stop_node(running)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="udfd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_healthy_node_passes_every_check_and_exits_0(node: NodeProcess) -> None:
    run = run_doctor("healthy", ["--runtime-dir", str(node.runtime_dir)])

    assert run.code == 0, run.output
    (server,) = node.discovery().servers  # type: ignore[union-attr]
    assert f"discovery file: {node.discovery_path}, written by " in run.output
    assert "heartbeat: written " in run.output and "taken for absent after 10 s" in run.output
    lock = node.runtime_dir / "node.lock"
    assert f"supervisor: pid {node.pid} runs and holds the node's lock {lock}" in run.line_of("supervisor")
    assert run.line_of("sim:0").startswith(
        f"ok    sim:0: health SERVING over unix://{server.unix_socket} (pid {server.pid}); serves "
        "tabular_mlp version 1"
    )
    assert "token: none configured, and the servers ask for none" in run.output
    assert "can create payload files in it" in run.line_of("folder")
    assert "NVML: " in run.output  # described whatever this host has: absent NVML is no failure
    assert run.line_of("tensorflow").startswith("ok    tensorflow: tensorflow ")
    assert run.line_of("tensorflow").endswith(" imports; model tabular_mlp of the node's repository needs it")
    assert f"interpreter: PYSPARK_PYTHON={sys.executable} imports pyarrow" in run.line_of("interpreter")
    assert "FAIL" not in run.output and "WARN" not in run.output
    assert run.output.rstrip().endswith("Healthy: nothing blocks jobs (0 warnings). Exit code 0.")


def test_the_json_report_holds_each_finding_with_its_figures(node: NodeProcess) -> None:
    run = run_doctor(None, ["--runtime-dir", str(node.runtime_dir), QUICK, "--json"])

    report = run.report()
    assert run.code == 0 and report["healthy"] is True
    assert report["counts"]["fail"] == 0 and report["counts"]["ok"] >= 8
    by_name = {(f["group"], f["name"]): f for f in report["findings"]}
    assert by_name[("servers", "sim:0")]["facts"]["serving"] == {"tabular_mlp": [1]}
    assert by_name[("discovery", "supervisor")]["facts"]["pid"] == node.pid
    assert by_name[("discovery", "heartbeat")]["facts"]["stale_after_s"] == 10.0
    assert by_name[("backends", "tensorflow")]["facts"]["models"] == ["tabular_mlp"]
    assert {f["status"] for f in report["findings"]} <= {"ok", "info"}


def test_no_discovery_file_blocks_jobs_and_says_to_start_the_node(scratch: Path) -> None:
    run = run_doctor("no-node", ["--runtime-dir", str(scratch), QUICK])

    assert run.code == 1
    line = run.line_of("discovery file")
    assert line.startswith(f"FAIL  discovery file: no discovery file at {scratch / 'discovery.json'}")
    assert "send every row to the CPU fallback" in line and "fix: start `udfserve node` on this host" in line
    assert "Not healthy: 1 problem blocks jobs (discovery file)" in run.output


def test_a_runtime_folder_others_may_write_is_refused_as_the_client_refuses_it(node: NodeProcess) -> None:
    node.runtime_dir.chmod(0o777)
    try:
        run = run_doctor("runtime-folder-mode", ["--runtime-dir", str(node.runtime_dir), QUICK])
    finally:
        node.runtime_dir.chmod(0o755)

    assert run.code == 1
    line = run.line_of("discovery file")
    assert f"refusing discovery file {node.discovery_path}" in line
    assert f"({node.runtime_dir}) has mode 0777: writable by other users" in line
    assert "The client refuses it just as this check did" in line and "chmod go-w" in line


def test_a_socket_this_user_cannot_connect_to_is_reported_with_the_tcp_port_it_falls_back_to(
    node: NodeProcess,
) -> None:
    (server,) = node.discovery().servers  # type: ignore[union-attr]
    socket_path = Path(server.unix_socket or "")
    socket_path.chmod(0o000)
    try:
        run = run_doctor(
            "socket-unreachable",
            ["--runtime-dir", str(node.runtime_dir), QUICK],
            wrapper=as_user_of_file_modes(),
        )
    finally:
        socket_path.chmod(0o600)

    assert run.code == 0  # the client reaches the server over TCP: slower, not blocked
    line = run.line_of("sim:0")  # the first sim:0 finding is the server's, over TCP
    assert line.startswith(f"ok    sim:0: health SERVING over {server.tcp_address}")
    sockets = run.section("Unix sockets")
    assert sockets.startswith(f"WARN sim:0: {socket_path} refuses ") and "the socket has mode 0000" in sockets
    assert f"falls back to its TCP port {server.tcp_address}, without shared memory" in sockets


def test_a_node_in_another_pid_namespace_is_found_alive_by_its_lock(node: NodeProcess) -> None:
    run = run_doctor(
        "another-pid-namespace",
        ["--runtime-dir", str(node.runtime_dir), QUICK],
        wrapper=in_another_pid_namespace(),
    )

    assert run.code == 0, run.output
    lock = node.runtime_dir / "node.lock"
    assert run.line_of("supervisor") == (
        f"ok    supervisor: a process of another PID namespace holds the node's lock {lock} (the supervisor, "
        f"pid {node.pid} in its own): the node runs in another container"
    )
    assert run.line_of("sim:0").startswith("ok    sim:0: health SERVING over unix://")


def test_a_pyspark_python_without_the_client_blocks_jobs(node: NodeProcess, scratch: Path) -> None:
    bare = bare_environment(scratch / "bare")

    run = run_doctor(
        "pyspark-python", ["--runtime-dir", str(node.runtime_dir), QUICK], env={"PYSPARK_PYTHON": str(bare)}
    )

    assert run.code == 1
    line = run.line_of("interpreter")
    assert f"FAIL  interpreter: Spark's Python workers would run {bare} (PYSPARK_PYTHON={bare})" in line
    assert "which cannot import pyarrow (No module named 'pyarrow')" in line
    assert f"with udfserve's client installed (such as {sys.executable})" in line


def test_a_framework_missing_from_this_environment_names_the_models_that_need_it(
    node: NodeProcess, scratch: Path
) -> None:
    python = environment_without(["tensorflow"], scratch / "no-tensorflow")

    run = run_doctor(
        "backend-missing",
        ["--runtime-dir", str(node.runtime_dir), QUICK],
        env={"PYSPARK_PYTHON": str(python)},
        python=str(python),
    )

    assert run.code == 0  # the servers serve; only this environment's CPU fallback lacks the framework
    line = run.line_of("tensorflow")
    assert line.startswith("WARN  tensorflow: not installed ('tensorflow' cannot be imported)")
    assert "model tabular_mlp of the node's repository needs it: the CPU fallback here cannot run it" in line
    assert "fix: pip install 'udfserve[tensorflow]' in this environment" in line
    assert run.line_of("onnxruntime").startswith("ok    onnxruntime: onnxruntime is installed")


def test_a_shared_memory_folder_this_user_cannot_write_sends_batches_inline(node: NodeProcess) -> None:
    folder = Path(tempfile.mkdtemp(prefix="udfd-", dir="/dev/shm"))  # a tmpfs
    folder.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)  # another user's folder in shared memory, as the servers' own
    else:
        folder.chmod(0o555)

    try:
        run = run_doctor(
            "shared-memory-mode",
            ["--runtime-dir", str(node.runtime_dir), QUICK, "--shared-memory-dir", str(folder)],
            wrapper=as_user_of_file_modes(),
        )
    finally:
        folder.chmod(0o755)
        folder.rmdir()

    assert run.code == 0  # batches travel inline: slower, nothing lost
    line = run.line_of("folder")
    assert f"cannot create payload files in {folder} (mode 0755" in line or "(mode 0555" in line
    assert "creating a file: Permission denied" in line and "send every batch inline" in line
    assert "fix: see docs/deployment.md, Shared memory" in line
    assert run.section("Shared memory").count("WARN") == 1  # a tmpfs, with free space


@pytest.fixture
def full_tmpfs(scratch: Path) -> Iterator[Path]:
    """A tmpfs of 4 MiB, filled up."""
    folder = scratch / "shm-full"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=1777", "tmpfs", str(folder)])
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {folder}")
    try:
        descriptor = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with contextlib.suppress(OSError):  # ENOSPC: full
            while os.write(descriptor, bytes(64 << 10)):
                pass
        os.close(descriptor)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_full_shared_memory_folder_is_reported_with_its_free_space(
    node: NodeProcess, full_tmpfs: Path
) -> None:
    run = run_doctor(
        "shared-memory-full",
        ["--runtime-dir", str(node.runtime_dir), QUICK, "--shared-memory-dir", str(full_tmpfs)],
    )

    assert run.code == 0
    shared = run.section("Shared memory")
    assert f"cannot create payload files in {full_tmpfs}" in shared and "No space left on device" in shared
    assert f"{full_tmpfs} has 0 bytes free of 4.0 MiB, less than 16.0 MiB" in shared
