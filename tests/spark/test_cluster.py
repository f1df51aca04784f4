"""A small standalone cluster: node-local routing and GPU-resource routing, checked from the servers.

A master and two workers are started with ``spark-class`` from the pip-installed PySpark. Each
worker is one "node": its environment points ``UDFSERVE_DISCOVERY_FILE`` at its own discovery
file, listing its own two model servers, labelled as devices 0 and 1 (``sim:N``: CPU processes
standing for GPUs). Each worker offers a ``gpu`` resource through ``deploy/spark/gpu_discovery.sh``
reporting ids 0 and 1. The job runs in a separate driver process (``cluster_driver.py``), which
tags each row with the node and the GPU of its task; the servers' ``/metrics`` must then show
exactly those rows, server by server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.short_lived_jvms import short_lived_jvm_environment
from udfserve.discovery import DISCOVERY_FILE_ENV, NodeDiscovery, ServerEntry, write_discovery
from udfserve.services.model_server.launcher import ServerProcess, launch_server, wait_until_serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cluster_driver.py")
GPU_DISCOVERY_SCRIPT = ROOT / "deploy" / "spark" / "gpu_discovery.sh"
NODES = ("node-a", "node-b")
DEVICES = (0, 1)
ROWS = 20_000


@dataclass
class Node:
    name: str
    discovery_file: Path
    servers: dict[int, ServerProcess]  # by device index


@dataclass
class Cluster:
    master_url: str
    nodes: list[Node]


MASTER_URL_LINE = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI_LINE = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


def master_addresses(log_path: Path, master: subprocess.Popen[bytes], timeout_s: float) -> tuple[str, str]:
    """The master's URL and web UI, as it logs them once bound (it picks both ports itself:
    a port probed free beforehand can be taken before the master binds it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if master.poll() is not None:
            raise RuntimeError(f"the spark master exited with {master.returncode}; see {log_path}")
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        url, ui = MASTER_URL_LINE.search(text), MASTER_UI_LINE.search(text)
        if url and ui:
            return url.group(1), f"http://127.0.0.1:{ui.group(1)}"
        time.sleep(0.2)
    raise TimeoutError(f"the spark master did not log its addresses within {timeout_s:g} s; see {log_path}")


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def start_daemon(
    arguments: list[str], environment: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """A Spark daemon in the foreground through ``spark-class``, its output in ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(spark_class()), *arguments], env=environment, stdout=log, stderr=subprocess.STDOUT
        )


def wait_for_workers(
    web_url: str, count: int, processes: list[subprocess.Popen[bytes]], timeout_s: float
) -> None:
    """Until the master lists ``count`` alive workers; fails early if a daemon exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"spark daemon {process.args} exited with {process.returncode}")
        try:
            status = json.loads(urllib.request.urlopen(f"{web_url}/json/", timeout=5).read())
            if status.get("aliveworkers", 0) >= count:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the master at {web_url} did not list {count} alive workers within {timeout_s:g} s")


@pytest.fixture(scope="module")
def cluster(tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    nodes: list[Node] = []
    for name in NODES:
        folder = root / name
        servers = {
            index: launch_server(
                tabular_onnx_repository,
                device=f"sim:{index}",
                socket=folder / f"gpu{index}.sock",
                port=0,
                http_port=0,
                extra_args=["--models", "tabular_mlp"],
                log_path=folder / f"server{index}.log",
                wait=False,
            )
            for index in DEVICES
        }
        nodes.append(Node(name, folder / "discovery.json", servers))
    daemons: list[subprocess.Popen[bytes]] = []
    environment = {
        **short_lived_jvm_environment(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
    }
    try:
        # the master needs no server: its JVM starts while the servers load the model
        master = start_daemon(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", "0", "--webui-port", "0"],
            environment, root / "master.log",
        )  # fmt: skip
        daemons.append(master)
        for node in nodes:
            for server in node.servers.values():
                wait_until_serving(server, 180)
            entries = [
                ServerEntry(
                    device=f"sim:{index}",
                    device_index=index,
                    unix_socket=server.unix_socket,
                    tcp_address=server.tcp_address,
                    http_address=server.http_address,
                )
                for index, server in node.servers.items()
            ]
            write_discovery(
                node.discovery_file,
                NodeDiscovery(node=node.name, model_repository=str(tabular_onnx_repository), servers=entries),
            )
        master_url, web_url = master_addresses(root / "master.log", master, timeout_s=120)
        for node in nodes:
            folder = node.discovery_file.parent
            properties = folder / "worker.properties"
            properties.write_text(
                "spark.worker.resource.gpu.amount 2\n"
                f"spark.worker.resource.gpu.discoveryScript {GPU_DISCOVERY_SCRIPT}\n"
            )
            worker_environment = {
                **environment,
                DISCOVERY_FILE_ENV: str(node.discovery_file),
                "UDFSERVE_GPU_ADDRESSES": "0,1",
            }
            daemons.append(
                start_daemon(
                    ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--cores", "2", "--memory", "1200m", "--webui-port", "0",
                     "--work-dir", str(folder / "work"), "--properties-file", str(properties), master_url],
                    worker_environment, folder / "worker.log",
                )
            )  # fmt: skip
        wait_for_workers(web_url, len(nodes), daemons, timeout_s=120)
        yield Cluster(master_url, nodes)
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        for node in nodes:
            for server in node.servers.values():
                server.terminate()


def rows_served(server: ServerProcess) -> float:
    text = urllib.request.urlopen(f"http://{server.http_address}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('udfserve_rows_total{model="tabular_mlp"}')
    )


def run_job(cluster: Cluster, *, gpu_per_task: bool) -> dict[str, object]:
    driver_environment = {
        **short_lived_jvm_environment(),
        DISCOVERY_FILE_ENV: str(cluster.nodes[0].discovery_file),
    }
    completed = subprocess.run(
        [sys.executable, str(DRIVER), "--master", cluster.master_url, "--rows", str(ROWS),
         "--partitions", "16", "--executors", "4"] + (["--gpu-per-task"] if gpu_per_task else []),
        env=driver_environment, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        stderr = completed.stderr.decode(errors="replace")[-4000:]
        raise AssertionError(f"the driver failed with {completed.returncode}:\n{stderr}")
    result: dict[str, object] = json.loads(completed.stdout)
    assert result["rows"] == ROWS and result["distinct_ids"] == ROWS
    return result


def served_deltas(cluster: Cluster, before: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    return {
        (node.name, index): rows_served(server) - before[(node.name, index)]
        for node in cluster.nodes
        for index, server in node.servers.items()
    }


def snapshot(cluster: Cluster) -> dict[tuple[str, int], float]:
    return {
        (node.name, index): rows_served(server)
        for node in cluster.nodes
        for index, server in node.servers.items()
    }


def test_every_task_reaches_the_servers_of_its_own_node(cluster: Cluster) -> None:
    before = snapshot(cluster)
    result = run_job(cluster, gpu_per_task=False)
    served = served_deltas(cluster, before)
    node_of_file = {str(node.discovery_file): node.name for node in cluster.nodes}
    rows_by_node = {name: 0 for name in NODES}
    for discovery_file, _gpu, rows in result["rows_by_node_and_gpu"]:  # type: ignore[union-attr]
        rows_by_node[node_of_file[discovery_file]] += rows
    assert all(rows > 0 for rows in rows_by_node.values()), f"tasks did not run on both nodes: {rows_by_node}"
    for name in NODES:
        assert sum(served[(name, index)] for index in DEVICES) == rows_by_node[name], (
            name,
            served,
            rows_by_node,
        )


def test_every_task_reaches_the_server_of_the_gpu_spark_assigned_it(cluster: Cluster) -> None:
    before = snapshot(cluster)
    result = run_job(cluster, gpu_per_task=True)
    served = served_deltas(cluster, before)
    node_of_file = {str(node.discovery_file): node.name for node in cluster.nodes}
    expected = {(name, index): 0 for name in NODES for index in DEVICES}
    for discovery_file, gpu, rows in result["rows_by_node_and_gpu"]:  # type: ignore[union-attr]
        assert gpu in {"0", "1"}, f"a task ran without a GPU assigned: {result}"
        expected[(node_of_file[discovery_file], int(gpu))] += rows
    assert served == expected
    assert sum(1 for rows in expected.values() if rows > 0) >= 2, f"tasks used a single GPU only: {expected}"
