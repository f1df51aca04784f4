"""A node whose servers run the native KServe front end publishes its address and its socket in the
runtime folder per server, and which front end serves (``kserve_frontend``), as the shipped
configurations start them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import tritonclient.grpc as triton
from doctor_harness import run_doctor
from node_harness import NodeProcess, stop_node

from udfserve.services.model_server.frontends.kserve.native import BUILD_COMMAND
from udfserve.spark_client import ClientConfig
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.protocols import describe_model

SHIPPED_SERVER_ARGS = "--server-args=--kserve-frontend auto --kserve-port 0"
NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"


def test_each_servers_native_kserve_address_is_in_the_discovery_file(tabular_onnx_repository: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(
        root / "rt",
        tabular_onnx_repository,
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
    tabular_onnx_repository: Path,
) -> None:
    """--kserve-frontend auto --kserve-port 0, what the image, compose and Kubernetes give the servers:
    the native front end here, where the module is built."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(root / "rt", tabular_onnx_repository, "sim:0", [SHIPPED_SERVER_ARGS])
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


def test_the_shipped_server_args_serve_kserve_natively_on_a_socket_in_the_runtime_folder(
    tabular_onnx_repository: Path,
) -> None:
    """Executors in other containers reach servers only through the runtime folder: each server asked
    for the native front end listens there too, the discovery file names the socket, and it is gone
    once the node has stopped."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(root / "rt", tabular_onnx_repository, "sim:0", [SHIPPED_SERVER_ARGS])
    try:
        [server] = node.wait_all_ready(1).servers
        assert server.kserve_frontend == "native"
        assert server.kserve_socket == str(root / "rt" / "kserve-sim0.sock")
        tensor = triton.InferInput("features", [3, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((3, 64), np.float32))
        with triton.InferenceServerClient(f"unix://{server.kserve_socket}") as client:
            assert client.infer("tabular_mlp", [tensor]).as_numpy("probabilities").shape == (3, 8)
        stop_node(node)
        assert not (root / "rt" / "kserve-sim0.sock").exists()
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def test_the_spark_clients_kserve_protocol_sends_its_rows_to_the_published_kserve_socket(
    tabular_onnx_repository: Path,
) -> None:
    """The partition runner, as an executor runs it, routed by the node's discovery file alone."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    node = NodeProcess(root / "rt", tabular_onnx_repository, "sim:0", [SHIPPED_SERVER_ARGS])
    try:
        [server] = node.wait_all_ready(1).servers
        config = ClientConfig(protocol="kserve", discovery_file=str(node.discovery_path), fallback="error")
        target = f"unix://{server.kserve_socket}"
        job = PredictJob("tabular_mlp", describe_model(target, config, "tabular_mlp").spec, config)
        column = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(3 * 64, np.float32)), 64)
        batches = [pa.RecordBatch.from_arrays([column], names=["features"])] * 4
        stats = ClientStats()
        answers = list(
            predict_partition(
                job, iter(batches), {}, TaskPlacement(), stats=stats, breakers=CircuitBreakers()
            )
        )
        assert [answer.num_rows for answer in answers] == [3, 3, 3, 3]
        assert stats.rows_by_address == {target: 12}
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)


def test_without_the_native_module_the_kserve_port_is_served_by_python_and_the_doctor_warns(
    tabular_onnx_repository: Path,
) -> None:
    """The shipped server args on a node whose Python cannot import the compiled module (an image or
    a wheel built without grpc++): a ``sitecustomize`` puts None in ``sys.modules`` for it, Python's
    own "not installed", in the node and the servers it starts."""
    root = Path(tempfile.mkdtemp(prefix="udfn-"))
    blocker = root / "no-native"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(f"import sys\nsys.modules[{NATIVE_MODULE!r}] = None\n")
    env = {"PYTHONPATH": str(blocker)}
    node = NodeProcess(root / "rt", tabular_onnx_repository, "sim:0", [SHIPPED_SERVER_ARGS], env=env)
    try:
        [server] = node.wait_all_ready(1).servers
        assert server.kserve_frontend == "python" and server.kserve_address is not None
        tensor = triton.InferInput("features", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
        for target in (server.kserve_address, f"unix://{server.kserve_socket}"):  # the fallback serves both
            with triton.InferenceServerClient(target) as client:
                assert client.infer("tabular_mlp", [tensor]).as_numpy("probabilities").shape == (1, 8)
        run = run_doctor(
            None, ["--runtime-dir", str(root / "rt"), "--no-import-frameworks", "--json"], env=env
        )
        [finding] = [f for f in run.report()["findings"] if f["name"] == "native KServe front end"]
        assert finding["status"] == "warn" and finding["facts"]["servers_fallen_back"] == ["sim:0"]
        assert BUILD_COMMAND in finding["fix"]
    finally:
        stop_node(node)
        shutil.rmtree(root, ignore_errors=True)
