"""Prometheus and Grafana configuration against the compose file and the node's real paths.

Prometheus must read the targets file where the supervisor writes it (through the shared
volume), Grafana must reach Prometheus by its compose name and load the dashboard from where
compose mounts it, and every panel must use the provisioned data source.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import (
    DASHBOARD_FILE,
    DEPLOY,
    NODE_SERVICES,
    argv_of,
    environment_of,
    kubernetes_object,
    load_compose,
    mount_for,
    node_config,
    node_settings,
)

COMPOSE = load_compose()
SERVICES: dict[str, Any] = COMPOSE["services"]
PROMETHEUS_FILE = DEPLOY / "prometheus" / "prometheus.yml"
KUBERNETES_SCRAPE_FILE = DEPLOY / "prometheus" / "kubernetes-scrape.yml"
DATASOURCE_FILE = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER_FILE = DEPLOY / "grafana" / "provisioning" / "dashboards" / "udfserve.yml"


def load_yaml(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return yaml.safe_load(handle)


def container_path_of(service: str, repository_file: Path) -> Path:
    """Where a bind-mounted repository file or folder appears inside the service's container."""
    for volume in SERVICES[service]["volumes"]:
        source, target = volume.split(":")[:2]
        if not source.startswith("."):
            continue
        source_path = (PROMETHEUS_FILE.parents[2] / source).resolve()
        if repository_file.resolve() == source_path:
            return Path(target)
        if source_path in repository_file.resolve().parents:
            return Path(target) / repository_file.resolve().relative_to(source_path)
    raise AssertionError(f"{service} does not mount {repository_file}")


def udfserve_job() -> dict[str, Any]:
    [job] = [j for j in load_yaml(PROMETHEUS_FILE)["scrape_configs"] if j["job_name"] == "udfserve"]
    return job


def test_prometheus_loads_the_repository_config() -> None:
    argv = argv_of(SERVICES["prometheus"]["command"])
    config_flag = next(a for a in argv if a.startswith("--config.file="))
    assert Path(config_flag.partition("=")[2]) == container_path_of("prometheus", PROMETHEUS_FILE)


@pytest.mark.parametrize("node", NODE_SERVICES)
def test_prometheus_reads_the_targets_file_where_the_supervisor_writes_it(node: str, tmp_path: Path) -> None:
    config = node_config(*node_settings(COMPOSE, node), tmp_path)
    node_mount, relative = mount_for(SERVICES[node], config.targets_path)
    [sd] = udfserve_job()["file_sd_configs"]
    [path] = sd["files"]
    prometheus_mount, prometheus_relative = mount_for(SERVICES["prometheus"], Path(path))
    assert prometheus_mount.source == node_mount.source, "not the same volume"
    assert prometheus_relative == relative
    assert prometheus_mount.read_only


def test_prometheus_scrapes_the_metrics_path_of_the_admin_apps() -> None:
    from deploy_files import admin_app_paths

    assert udfserve_job()["metrics_path"] in admin_app_paths()


def test_prometheus_scrapes_more_often_than_grafana_assumes() -> None:
    interval = load_yaml(PROMETHEUS_FILE)["global"]["scrape_interval"]
    [source] = load_yaml(DATASOURCE_FILE)["datasources"]
    assert source["jsonData"]["timeInterval"] == interval


def relabel(rules: list[dict[str, Any]], meta: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's keep/replace relabelling (snake_case or the operator's camelCase keys).

    Returns the target's labels, or None when a keep rule drops it. Prometheus anchors regexes,
    hence fullmatch; ``$1`` in a replacement is a group reference.
    """
    labels = dict(meta)
    for rule in rules:
        sources = rule.get("source_labels", rule.get("sourceLabels", []))
        value = rule.get("separator", ";").join(labels.get(s, "") for s in sources)
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace") == "keep":
            if match is None:
                return None
        elif match is not None:
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule.get("target_label", rule.get("targetLabel"))] = match.expand(replacement)
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def pod_port_meta(port: str) -> dict[str, str]:
    """The discovery labels Prometheus's kubernetes_sd gives one port of a udfserve-node pod."""
    daemonset = kubernetes_object("DaemonSet")
    return {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": daemonset["metadata"]["name"],
        "__meta_kubernetes_pod_container_port_name": port,
        "__meta_kubernetes_pod_node_name": "gpu-node-7",
    }


def expected_labels(port: str) -> dict[str, str]:
    if port == "supervisor":
        return {"node": "gpu-node-7", "role": "supervisor"}
    return {"node": "gpu-node-7", "role": "model_server", "device": f"gpu:{port.removeprefix('server-')}"}


def daemonset_ports() -> list[str]:
    [container] = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return [p["name"] for p in container["ports"]]


def test_kubernetes_scrape_config_labels_every_daemonset_port_like_the_targets_file() -> None:
    [job] = load_yaml(KUBERNETES_SCRAPE_FILE)["scrape_configs"]
    for port in daemonset_ports():
        assert relabel(job["relabel_configs"], pod_port_meta(port)) == expected_labels(port), port


def test_kubernetes_scrape_config_drops_other_ports() -> None:
    [job] = load_yaml(KUBERNETES_SCRAPE_FILE)["scrape_configs"]
    assert relabel(job["relabel_configs"], pod_port_meta("http")) is None


def test_podmonitor_labels_every_daemonset_port_like_the_targets_file() -> None:
    endpoints = kubernetes_object("PodMonitor")["spec"]["podMetricsEndpoints"]
    by_port = {e["port"]: e for e in endpoints}
    for port in daemonset_ports():
        labels = relabel(by_port[port]["relabelings"], pod_port_meta(port))
        assert labels is not None and labels.items() >= expected_labels(port).items(), port


def test_expected_kubernetes_labels_are_those_of_the_targets_file() -> None:
    from udfserve.discovery import ServerEntry
    from udfserve.services.node.targets import server_target, supervisor_target

    entry = ServerEntry(device="gpu:0", device_index=0, http_address="10.0.0.5:7501")
    server = server_target(entry, "gpu-node-7", None)["labels"]
    supervisor = supervisor_target("10.0.0.5:7490", "gpu-node-7", None)["labels"]
    assert expected_labels("server-0").items() <= server.items()
    assert expected_labels("supervisor") == supervisor


def test_grafana_reaches_prometheus_by_its_compose_name() -> None:
    [source] = load_yaml(DATASOURCE_FILE)["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in SERVICES
    assert SERVICES["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_grafana_loads_provisioning_and_dashboards_from_the_repository() -> None:
    provisioning = container_path_of("grafana", DATASOURCE_FILE.parent.parent)
    assert provisioning == Path("/etc/grafana/provisioning")
    [provider] = load_yaml(DASHBOARD_PROVIDER_FILE)["providers"]
    assert Path(provider["options"]["path"]) == container_path_of("grafana", DASHBOARD_FILE.parent)
    home = environment_of(SERVICES["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home) == container_path_of("grafana", DASHBOARD_FILE)


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD_FILE.read_text())["panels"] if p["type"] != "row"]


def test_every_panel_uses_the_provisioned_data_source() -> None:
    [source] = load_yaml(DATASOURCE_FILE)["datasources"]
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]


def test_dashboard_panels_fit_the_grid_and_have_unique_ids() -> None:
    panels = json.loads(DASHBOARD_FILE.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


REQUIRED_PANELS = (
    "GPU utilisation per device",
    "GPU memory per device",
    "Requests/s per model",
    "Rows/s per model",
    "Request latency p50 / p99",
    "Batch size (rows per device call)",
    "Queue wait p50 / p99",
    "Errors by code",
    "Server restarts",
)


@pytest.mark.parametrize("title", REQUIRED_PANELS)
def test_dashboard_has_the_panel(title: str) -> None:
    titles = [p["title"] for p in dashboard_panels()]
    assert title in titles


@pytest.mark.parametrize("title", ["Request latency p50 / p99", "Queue wait p50 / p99"])
def test_quantile_panels_read_histogram_buckets(title: str) -> None:
    [panel] = [p for p in dashboard_panels() if p["title"] == title and p["type"] == "timeseries"]
    expressions = [t["expr"] for t in panel["targets"]]
    assert [e.split(",")[0] for e in expressions] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    assert all("_bucket{" in e and "le)" in e for e in expressions)


def test_each_spark_application_gets_a_row_of_its_own() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "app"]
    assert "udfserve_app_rows_total" in variable["query"]["query"] and variable["includeAll"]
    panels = dashboard["panels"]
    [row_index] = [i for i, p in enumerate(panels) if p["type"] == "row" and p.get("repeat") == "app"]
    in_row = panels[row_index + 1 :]
    assert all(p["type"] != "row" for p in in_row), "the repeated row must be the last one"
    assert {p["title"] for p in in_row} == {
        "Rows/s of $app",
        "Latency p50 / p99 of $app",
        "Errors of $app",
        "Servers and devices carrying $app",
    }
    for panel in in_row:
        assert all('app_name=~"$app"' in t["expr"] for t in panel["targets"]), panel["title"]
