"""A node whose servers require a bearer token: the supervisor still sees them ready."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from node_harness import NodeProcess, predict_tabular, stop_node


def test_servers_that_require_a_token_are_published_ready_with_their_models(
    tabular_onnx_repository: Path,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    token_file = root / "token"
    token_file.write_text("node-secret\n")
    node = NodeProcess(
        root / "rt", tabular_onnx_repository, "sim:0", [f"--server-args=--auth-token-file {token_file}"]
    )
    try:
        (server,) = node.wait_all_ready(1).servers
        assert server.state == "ready" and "tabular_mlp" in server.models
        assert server.unix_socket is not None
        predict_tabular(server.unix_socket, token="node-secret")  # answered, no error
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
