"""A node whose servers run the native KServe front end publishes its address per server."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton
from node_harness import NodeProcess, stop_node


def test_each_servers_native_kserve_address_is_in_the_discovery_file(example_repository: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(
        root / "rt",
        example_repository,
        "sim:0,sim:1",
        ["--server-args=--kserve-frontend native --kserve-port 0"],
    )
    try:
        discovery = node.wait_all_ready(2)
        addresses = [server.kserve_address for server in discovery.servers]
        assert all(addresses) and len(set(addresses)) == 2, addresses
        # no KServe over HTTP without --kserve-http-port: its address is null
        assert [server.kserve_http_address for server in discovery.servers] == [None, None]
        x = np.ones((2, 64), np.float32)
        for address in addresses:
            assert address is not None
            with triton.InferenceServerClient(address) as client:
                tensor = triton.InferInput("features", [2, 64], "FP32")
                tensor.set_data_from_numpy(x)
                assert client.infer("tabular_mlp", [tensor]).as_numpy("probabilities").shape == (2, 8)
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
