"""`udfserve node` on a repository with no model to serve: the reason, not a silent "starting"."""

from __future__ import annotations

import json
from pathlib import Path

from node_harness import NodeProcess, entry_for, http_get, stop_node


def test_a_models_own_folder_as_repository_is_explained_in_the_discovery_file_and_the_nodes_readiness(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    model_folder = tabular_onnx_repository / "tabular_mlp"
    hour = ["--restart-backoff-initial-s", "3600", "--restart-backoff-max-s", "3600"]
    node = NodeProcess(short_dir / "rt", model_folder, "sim:0", hour)
    try:
        discovery = node.wait_for(lambda d: bool(entry_for(d, "sim:0").problem), "a problem of sim:0")
        entry = entry_for(discovery, "sim:0")
        status, body = http_get(node.supervisor_http_address(), "/health/ready")
    finally:
        stop_node(node)

    problem = entry.problem or ""
    assert f"model repository {model_folder} holds no servable model" in problem
    assert f"its parent {tabular_onnx_repository} is probably the repository" in problem
    assert entry.state == "restarting" and entry.tcp_address is None
    readiness = json.loads(body)
    assert status == 503 and readiness["servers"] == {"sim:0": "restarting"}
    assert readiness["problems"] == {"sim:0": problem}
    assert "model server on sim:0 did not become ready" in node.log() and problem in node.log()
