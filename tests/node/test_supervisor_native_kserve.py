"""A node whose servers run the native KServe front end publishes its address per server, and
which front end serves (``kserve_frontend``), as the shipped configurations start them."""

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
        assert [server.kserve_frontend for server in discovery.servers] == ["native", "native"]
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


def test_the_shipped_server_args_serve_kserve_natively_and_the_discovery_file_says_so(
    example_repository: Path,
) -> None:
    """--kserve-frontend auto --kserve-port 0, what the image, compose and Kubernetes give the servers:
    the native front end here, where the module is built."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(
        root / "rt", example_repository, "sim:0", ["--server-args=--kserve-frontend auto --kserve-port 0"]
    )
    try:
        [server] = node.wait_all_ready(1).servers
        assert server.kserve_frontend == "native" and server.kserve_address is not None
        tensor = triton.InferInput("features", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
        with triton.InferenceServerClient(server.kserve_address) as client:
            assert client.infer("tabular_mlp", [tensor]).as_numpy("probabilities").shape == (1, 8)
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
