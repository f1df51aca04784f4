"""A node whose servers serve KServe v2 over HTTP (``--kserve-http-port``) publishes that address
per server in its discovery file, beside the main and native gRPC ones."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
from node_harness import NodeProcess, stop_node


def test_each_servers_kserve_http_address_is_in_the_discovery_file(tabular_onnx_repository: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(root / "rt", tabular_onnx_repository, "sim:0", ["--server-args=--kserve-http-port 0"])
    try:
        (server,) = node.wait_all_ready(1).servers
        assert server.kserve_http_address is not None, server
        assert server.kserve_http_address != server.http_address  # not the admin app's
        tensor = triton_http.InferInput("features", [2, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
        with triton_http.InferenceServerClient(server.kserve_http_address) as client:
            assert client.infer("tabular_mlp", [tensor]).as_numpy("probabilities").shape == (2, 8)
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
