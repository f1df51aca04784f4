"""``udfserve doctor`` against a node whose servers require a token: the token the jobs would send
is read as the client reads it, and sent to every server, which accepts or refuses it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_harness import run_doctor
from node_harness import NodeProcess, stop_node

QUICK = "--no-import-frameworks"
TOKEN = "node-secret"


@pytest.fixture(scope="module")
def token_node(tabular_onnx_repository: Path) -> Iterator[NodeProcess]:
    root = Path(tempfile.mkdtemp(prefix="udfd-"))
    token_file = root / "token"
    token_file.write_text(f"{TOKEN}\n")
    node = NodeProcess(
        root / "rt", tabular_onnx_repository, "sim:0", [f"--server-args=--auth-token-file {token_file}"]
    )
    try:
        node.wait_all_ready(1)
        yield node
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def write_token(folder: Path, text: str) -> Path:
    path = folder / "jobs-token"
    path.write_text(text)
    return path


def test_the_servers_token_is_accepted_and_required(token_node: NodeProcess) -> None:
    token_file = write_token(token_node.runtime_dir.parent, f"{TOKEN}\n")

    run = run_doctor(
        None, ["--runtime-dir", str(token_node.runtime_dir), QUICK, "--auth-token-file", str(token_file)]
    )

    assert run.code == 0, run.output
    assert run.line_of("token") == (
        f"ok    token: the token of {token_file} is accepted by every server, and each of them requires it"
    )
    assert run.line_of("sim:0").startswith(
        "ok    sim:0: health SERVING"
    ) and "serves tabular_mlp version 1" in (run.line_of("sim:0"))
    assert TOKEN not in run.output


def test_a_token_the_servers_refuse_blocks_jobs(token_node: NodeProcess) -> None:
    token_file = write_token(token_node.runtime_dir.parent, "last-years-secret\n")

    run = run_doctor(
        "token-wrong",
        ["--runtime-dir", str(token_node.runtime_dir), QUICK, "--auth-token-file", str(token_file)],
    )

    assert run.code == 1
    line = run.line_of("token")
    assert line.startswith(f"FAIL  token: the servers (sim:0) refuse the token of {token_file}: ")
    assert "jobs configured so fail (AuthenticationFailed)" in line and "spark.udfserve.authTokenFile" in line
    # the server itself is healthy: its models come from the discovery file, saying why
    assert (
        "serves tabular_mlp version 1 (as the discovery file lists them: its index answered UNAUTHENTICATED"
        in (run.line_of("sim:0"))
    )
    assert "last-years-secret" not in run.output


def test_no_token_where_the_servers_require_one_blocks_jobs(token_node: NodeProcess) -> None:
    run = run_doctor("token-missing", ["--runtime-dir", str(token_node.runtime_dir), QUICK])

    assert run.code == 1
    line = run.line_of("token")
    assert line.startswith("FAIL  token: the servers (sim:0) require a token and none is configured here")
    assert "fix: put the servers' token" in line


def test_an_empty_token_file_is_refused_in_the_clients_words(token_node: NodeProcess) -> None:
    token_file = write_token(token_node.runtime_dir.parent, "\n")

    run = run_doctor(
        "token-empty",
        ["--runtime-dir", str(token_node.runtime_dir), QUICK, "--auth-token-file", str(token_file)],
    )

    assert run.code == 1
    line = run.line_of("token")
    assert line.startswith(
        f"FAIL  token: auth token file {token_file} cannot be sent: auth_token_file {token_file} is empty; "
        "expected the token"
    )
