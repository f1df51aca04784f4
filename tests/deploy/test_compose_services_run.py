"""Each compose service whose program exists here, run as a plain process with its compose command
and settings (see conftest.py for the translation): the models generation, both node variants,
the Spark master and worker. Each must become healthy by its own compose health check.

Prometheus, Grafana and the demo job are not run here: the first two have no binary on this
machine (their configuration is checked in test_prometheus_and_grafana_config.py), and the demo
is the README's own command, tested with it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compose_harness import (
    POLL_INTERVAL_S,
    ComposeNode,
    child_environment,
    http_status,
    start_compose_node,
)
from deploy_files import argv_of, environment_of, kubernetes_object

from udfserve.discovery import read_discovery

SPARK_START_TIMEOUT_S = 180.0
Completed = subprocess.CompletedProcess[str]


def run_healthcheck(
    service: dict[str, Any], replacements: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The service's compose health check (a CMD list), with container addresses replaced."""
    argv = argv_of(service["healthcheck"]["test"])
    assert argv[0] == "CMD", argv
    command = []
    for word in argv[1:]:
        for old, new in replacements.items():
            word = word.replace(old, new)
        command.append(word)
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_models_service_writes_the_example_repository(compose_models: Path) -> None:
    models = sorted(p.name for p in compose_models.iterdir() if (p / "config.yaml").is_file())
    assert models == ["multi_io", "sequence_bilstm", "tabular_mlp", "text_hashing"]


@pytest.fixture(scope="module", params=["udfserve-node", "udfserve-node-cpu"])
def node(
    request: pytest.FixtureRequest, compose: dict[str, Any], compose_models: Path
) -> Iterator[ComposeNode]:
    if request.param == "udfserve-node":
        yield request.getfixturevalue("gpu_compose_node")
    else:
        yield from start_compose_node(compose, request.param, compose_models)


def test_node_becomes_healthy_by_its_compose_healthcheck(node: ComposeNode, compose: dict[str, Any]) -> None:
    service = compose["services"][node.service_name]
    port = environment_of(service)["UDFSERVE_SUPERVISOR_HTTP_PORT"]
    result = run_healthcheck(service, {f"127.0.0.1:{port}": node.supervisor_address()})
    assert result.returncode == 0, f"health check failed: {result.stderr}"


def test_node_serves_every_example_model_on_one_cpu_server(node: ComposeNode) -> None:
    discovery = read_discovery(node.discovery_path)
    [server] = discovery.ready_servers()
    assert server.device == "cpu"
    assert server.models == ["multi_io", "sequence_bilstm", "tabular_mlp", "text_hashing"]
    assert server.tcp_address is None, "gRPC listens on the unix socket only"
    assert server.unix_socket == str(node.runtime_dir / "server-cpu.sock")


def test_node_targets_file_lists_server_and_supervisor_at_the_advertised_host(
    node: ComposeNode, compose: dict[str, Any]
) -> None:
    env = environment_of(compose["services"][node.service_name])
    targets = node.targets()
    assert sorted(t["labels"]["role"] for t in targets) == ["model_server", "supervisor"]
    for target in targets:
        [address] = target["targets"]
        assert address.rpartition(":")[0] == env["UDFSERVE_ADVERTISE_HOST"]
        assert target["labels"]["node"] == env["UDFSERVE_NODE_NAME"]


def test_every_scrape_target_serves_metrics(node: ComposeNode) -> None:
    for target in node.targets():
        port = target["targets"][0].rpartition(":")[2]
        assert http_status(f"http://127.0.0.1:{port}/metrics") == 200, target


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_kubernetes_probe_paths_answer_on_the_supervisor(node: ComposeNode, probe: str) -> None:
    [container] = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]["containers"]
    path = container[probe]["httpGet"]["path"]
    assert http_status(f"http://{node.supervisor_address()}{path}") == 200


# -- Spark ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_argv(argv: list[str], replacements: dict[str, str]) -> list[str]:
    assert argv[0] == "spark-class", argv
    program = str(Path(sys.executable).parent / "spark-class")
    return [program, *(replacements.get(word, word) for word in argv[1:])]


def master_state(ui: str) -> dict[str, Any] | None:
    """The master's state from its UI; None while it is not up, or while the UI is up but answers
    /json/ with its HTML page (it does for a moment while the master starts)."""
    try:
        with urllib.request.urlopen(f"http://{ui}/json/", timeout=10) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def spark_cluster(compose: dict[str, Any]) -> Iterator[dict[str, str]]:
    """The compose master and worker commands on free local ports; yields the address map used."""
    services = compose["services"]
    ports = {"7077": str(free_port()), "8080": str(free_port()), "8081": str(free_port())}
    names = {"spark-master": "127.0.0.1", "spark-worker": "127.0.0.1"}
    replacements = {**ports, **names, "spark://spark-master:7077": f"spark://127.0.0.1:{ports['7077']}"}
    workdir = Path(tempfile.mkdtemp(prefix="udfs-spark-"))
    processes = []
    try:
        for name in ("spark-master", "spark-worker"):
            env = {k: names.get(v, v) for k, v in environment_of(services[name]).items()}
            env |= {"SPARK_WORKER_DIR": str(workdir / "work"), "SPARK_LOG_DIR": str(workdir)}
            with (workdir / f"{name}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen(
                        spark_argv(argv_of(services[name]["command"]), replacements),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=child_environment(env),
                        cwd=workdir,
                    )
                )
        ui = f"127.0.0.1:{ports['8080']}"
        deadline = time.monotonic() + SPARK_START_TIMEOUT_S
        while True:
            exited = [p.args[1] for p in processes if p.poll() is not None]
            assert not exited, f"{exited} exited; logs in {workdir}"
            state = master_state(ui)
            if state and any(w["state"] == "ALIVE" for w in state.get("workers", [])):
                break
            assert time.monotonic() < deadline, f"no worker registered after {SPARK_START_TIMEOUT_S:.0f} s"
            time.sleep(POLL_INTERVAL_S * 10)  # between looks at the master's state
        yield {f"127.0.0.1:{old}": f"127.0.0.1:{new}" for old, new in ports.items()}
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.slow
def test_spark_worker_registers_with_the_master(spark_cluster: dict[str, str]) -> None:
    state = master_state(spark_cluster["127.0.0.1:8080"])
    assert state is not None
    [worker] = state["workers"]
    assert worker["state"] == "ALIVE"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spark-master", "spark-worker"])
def test_spark_daemons_become_healthy_by_their_compose_healthchecks(
    name: str, spark_cluster: dict[str, str], compose: dict[str, Any]
) -> None:
    result = run_healthcheck(compose["services"][name], spark_cluster)
    assert result.returncode == 0, f"{name} health check failed: {result.stderr}"
