"""deploy/kubernetes/: objects of the kinds used, with the fields the API server requires, and
consistent with the code: probe paths the admin app serves, settings the node accepts, ports the
servers bind, the socket folder the executors mount, GPUs requested.

No cluster runs here: each object is checked for the required fields of its kind, and every value
that the code interprets is handed to the code (the CLI parser, NodeConfig, the admin app).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from deploy_files import (
    KUBERNETES,
    admin_app_paths,
    argv_of,
    first_server_config,
    kubernetes_documents,
    kubernetes_object,
    node_config,
    settings_field,
)

from udfserve.services.cli import build_parser
from udfserve.services.node.config import NodeConfig

API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Pod": "v1",
    "DaemonSet": "apps/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}
REQUIRED_SPEC = {
    "DaemonSet": ("selector", "template"),
    "Pod": ("containers",),
    "PodMonitor": ("selector",),
    "PrometheusRule": ("groups",),
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")  # IANA_SVC_NAME, 15 characters at most
DOCUMENTS = list(kubernetes_documents())


def daemonset_pod() -> dict[str, Any]:
    return kubernetes_object("DaemonSet")["spec"]["template"]["spec"]


def node_container() -> dict[str, Any]:
    [container] = daemonset_pod()["containers"]
    return container


def configmap() -> dict[str, str]:
    return kubernetes_object("ConfigMap")["data"]


def configured_node(tmp_path: Path) -> NodeConfig:
    """The NodeConfig the DaemonSet's container gets: its command, the ConfigMap, the downward API."""
    env = dict(configmap())
    for variable in node_container()["env"]:
        env[variable["name"]] = variable.get("value", "from-the-downward-api")
    args = build_parser().parse_args(argv_of(node_container()["command"])[1:])
    return node_config(env, args, tmp_path)


def container_ports() -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in node_container()["ports"]}


def gpu_limit() -> int:
    return int(node_container()["resources"]["limits"]["nvidia.com/gpu"])


@pytest.mark.parametrize(("path", "document"), DOCUMENTS, ids=[f"{p.name}:{d['kind']}" for p, d in DOCUMENTS])
def test_objects_have_the_fields_of_their_kind(path: Path, document: dict[str, Any]) -> None:
    kind = document.get("kind")
    assert kind in API_VERSIONS, f"{path.name}: unexpected kind {kind!r}"
    assert document.get("apiVersion") == API_VERSIONS[kind], (
        f"{path.name}: {kind} has {document.get('apiVersion')}"
    )
    if kind == "Kustomization":
        return
    name = document["metadata"]["name"]
    assert DNS_LABEL.match(name), f"{path.name}: {kind} name {name!r} is not a DNS label"
    if kind not in {"Namespace", "Pod"}:
        assert document["metadata"]["namespace"] == "udfserve", f"{path.name}: {kind} {name}"
    for field in REQUIRED_SPEC.get(kind, ()):
        assert field in document["spec"], f"{path.name}: {kind} {name} has no spec.{field}"


def test_every_file_holds_an_object() -> None:
    files = {path.name for path, _ in DOCUMENTS}
    assert files == {p.name for p in KUBERNETES.glob("*.yaml")}


def test_kustomization_lists_existing_files_and_leaves_out_the_optional_ones() -> None:
    resources = kubernetes_object("Kustomization")["resources"]
    for resource in resources:
        assert (KUBERNETES / resource).is_file(), f"kustomization.yaml lists {resource}, which does not exist"
    assert "podmonitor.yaml" not in resources, "a PodMonitor needs the Prometheus Operator's CRDs"
    assert "prometheusrule.yaml" not in resources, "a PrometheusRule needs the Prometheus Operator's CRDs"
    assert "spark-executor-pod-template.yaml" not in resources, "spark-submit reads the template"


def test_daemonset_selector_matches_its_pod_labels() -> None:
    daemonset = kubernetes_object("DaemonSet")
    selector = daemonset["spec"]["selector"]["matchLabels"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_daemonset_requests_nvidia_gpus_on_gpu_nodes() -> None:
    assert gpu_limit() >= 1
    assert daemonset_pod()["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in daemonset_pod()[
        "tolerations"
    ]


def test_node_command_is_accepted_by_the_real_cli() -> None:
    argv = argv_of(node_container()["command"])
    assert argv[:2] == ["udfserve", "node"]
    build_parser().parse_args(argv[1:])


def test_configmap_holds_node_settings_only() -> None:
    unknown = {v for v in configmap() if settings_field(v) not in NodeConfig.model_fields}
    assert not unknown, f"the ConfigMap sets {sorted(unknown)}, which are not fields of NodeConfig"


def test_settings_make_a_valid_node_config(tmp_path: Path) -> None:
    config = configured_node(tmp_path)
    assert config.devices == "auto" and config.server_port_base is None


def test_server_args_are_flags_of_udfserve_serve(tmp_path: Path) -> None:
    config = configured_node(tmp_path)
    serve = build_parser().parse_args(["serve", *config.server_extra_args])
    assert serve.socket_mode == "0660", "executor pods reach the sockets through their group"


def test_servers_serve_kserve_with_the_native_front_end_where_the_image_has_it(tmp_path: Path) -> None:
    """--kserve-frontend auto with a port: native where the module loads, else python on that port."""
    server = first_server_config(configured_node(tmp_path))
    assert (server.kserve_frontend, server.kserve_port) == ("auto", 0)
    assert server.host == "127.0.0.1", "the KServe port stays on the pod's loopback"
    assert server.kserve_socket is not None and server.socket is not None
    assert server.kserve_socket.parent == server.socket.parent, (
        "executor pods reach it where the main socket is"
    )


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_probes_ask_the_supervisor_on_paths_the_admin_app_serves(probe: str, tmp_path: Path) -> None:
    check = node_container()[probe]["httpGet"]
    assert check["path"] in admin_app_paths(), f"{probe} asks {check['path']}"
    assert container_ports()[check["port"]] == configured_node(tmp_path).supervisor_http_port


def test_liveness_asks_liveness_and_readiness_asks_readiness() -> None:
    assert node_container()["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert node_container()["readinessProbe"]["httpGet"]["path"] == "/health/ready"


def test_supervisor_binds_beyond_loopback_for_the_kubelet_probes(tmp_path: Path) -> None:
    config = configured_node(tmp_path)
    assert config.supervisor_http_host == "0.0.0.0" and config.server_http_host == "0.0.0.0"


def test_one_metrics_port_per_gpu_at_the_ports_the_servers_bind(tmp_path: Path) -> None:
    config = configured_node(tmp_path)
    ports = container_ports()
    servers = {name: port for name, port in ports.items() if name.startswith("server-")}
    assert servers == {f"server-{i}": config.server_http_port_base + i for i in range(gpu_limit())}
    assert ports["supervisor"] == config.supervisor_http_port
    for name in ports:
        assert PORT_NAME.match(name) and len(name) <= 15, f"port name {name!r} is not an IANA service name"


def test_podmonitor_scrapes_every_declared_port() -> None:
    monitor = kubernetes_object("PodMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == kubernetes_object("DaemonSet")["spec"]["selector"]["matchLabels"]
    )
    scraped = {endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == set(container_ports())


def test_runtime_folder_is_a_host_path_mounted_where_the_node_writes(tmp_path: Path) -> None:
    config = configured_node(tmp_path)
    [mount] = [m for m in node_container()["volumeMounts"] if Path(m["mountPath"]) == config.runtime_dir]
    [volume] = [v for v in daemonset_pod()["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"


def test_model_repository_is_mounted_read_only_and_filled_by_the_init_container() -> None:
    repository = Path(configmap()["UDFSERVE_MODEL_REPOSITORY"])
    [mount] = [m for m in node_container()["volumeMounts"] if Path(m["mountPath"]) == repository]
    assert mount["readOnly"] is True
    [init] = [c for c in daemonset_pod()["initContainers"] if "models" in argv_of(c["command"])]
    args = build_parser().parse_args(argv_of(init["command"])[1:])
    assert args.output == repository
    assert [m["name"] for m in init["volumeMounts"]] == [mount["name"]]


def executor_template() -> dict[str, Any]:
    return kubernetes_object("Pod")


def test_executor_pods_mount_the_same_host_folder_at_the_same_path(tmp_path: Path) -> None:
    """The discovery file names each socket by its path in the node's pod."""
    config = configured_node(tmp_path)
    node_volumes = {v["name"]: v for v in daemonset_pod()["volumes"]}
    [node_mount] = [m for m in node_container()["volumeMounts"] if Path(m["mountPath"]) == config.runtime_dir]
    template = executor_template()["spec"]
    [container] = template["containers"]
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config.runtime_dir]
    [volume] = [v for v in template["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == node_volumes[node_mount["name"]]["hostPath"]["path"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert Path(env["UDFSERVE_DISCOVERY_FILE"]) == config.discovery_path
    assert Path(env["UDFSERVE_RUNTIME_DIR"]) == config.runtime_dir


def test_executor_pods_join_the_group_the_sockets_are_shared_with() -> None:
    group = daemonset_pod()["securityContext"]["runAsGroup"]
    assert group in executor_template()["spec"]["securityContext"]["supplementalGroups"]


def test_executor_pods_go_where_the_daemonset_runs_and_request_no_gpu() -> None:
    template = executor_template()["spec"]
    assert template["nodeSelector"] == daemonset_pod()["nodeSelector"]
    [container] = template["containers"]
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    assert container["name"] == "spark-kubernetes-executor", "Spark's default executor container name"


def test_init_container_prepares_the_host_folder_for_the_node_user() -> None:
    [init] = [c for c in daemonset_pod()["initContainers"] if c["name"] == "runtime-dir"]
    script = shlex.join(argv_of(init["command"]))
    uid = daemonset_pod()["securityContext"]["runAsUser"]
    assert f"chown {uid}:{daemonset_pod()['securityContext']['runAsGroup']}" in script


CORE_DOCUMENTS = [(p, d) for p, d in DOCUMENTS if d["apiVersion"] in {"v1", "apps/v1"}]


@pytest.mark.parametrize(
    ("path", "document"), CORE_DOCUMENTS, ids=[f"{p.name}:{d['kind']}" for p, d in CORE_DOCUMENTS]
)
def test_core_objects_validate_against_the_kubernetes_schemas(path: Path, document: dict[str, Any]) -> None:
    """Strict validation (unknown fields refused) against the API schemas kubernetes-validate ships.

    PodMonitor and PrometheusRule (custom resources) and Kustomization have no schema there.
    """
    validator = pytest.importorskip(
        "kubernetes_validate", reason="the kubernetes-validate package is not installed"
    )
    validator.validate(document, validator.latest_version(), strict=True)


def test_kustomization_lets_users_point_the_server_image_at_their_registry() -> None:
    """`images:` rewrites every container of the DaemonSet that uses the server image."""
    [entry] = kubernetes_object("Kustomization")["images"]
    spec = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images == {f"{entry['name']}:{entry['newTag']}"}
    assert entry["newName"] == entry["name"], "the default points at the image compose builds"


def test_executor_pods_start_before_the_daemonset_made_the_host_folders() -> None:
    """A hostPath of type Directory fails the pod when the folder is not there yet."""
    volumes = kubernetes_object("Pod")["spec"]["volumes"]
    assert {v["name"]: v["hostPath"]["type"] for v in volumes if "hostPath" in v} == {
        "udfserve-runtime": "DirectoryOrCreate",
        "udfserve-shm": "DirectoryOrCreate",
    }
