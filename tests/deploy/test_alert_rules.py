"""The alerting rules of deploy/prometheus/alerts.yml: tested by promtool, written against the series a
real node exports, loaded where compose and Kubernetes put them, and evaluated by a real Prometheus.

- ``promtool test rules`` runs alerts_test.yml, which shows every rule firing and not firing (where
  promtool is installed: Debian's ``prometheus`` package ships it).
- Every metric and label a rule or a rule test uses appears in a real scrape: the compose
  ``udfserve-node`` service run here, whose repository holds a model that cannot load (so its
  failure counter exists), whose server answered a request (so its histograms have series), and
  to whose supervisor a client reported rows its CPU fallback answered (so its counter has series).
  The GPU gauges need NVML and a GPU: they are checked against gpu_metrics.py's declarations.
- A real Prometheus (Debian's, where installed) scrapes that node through its targets file and
  evaluates the rules: every rule evaluates without error, the failed load raises its alert, and
  nothing else fires on a node that is otherwise healthy.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
import yaml
from compose_harness import ComposeNode, start_compose_node
from deploy_files import (
    DEPLOY,
    declared_gpu_series,
    kubernetes_object,
    load_compose,
    mount_for,
    promql_label_names,
    promql_metric_names,
)
from prometheus_client.parser import text_string_to_metric_families

from udfserve.fallback_reports import add_fallback_rows, report_path
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import encode_batch

RULES_FILE = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS_FILE = DEPLOY / "prometheus" / "alerts_test.yml"
PROMETHEUS_FILE = DEPLOY / "prometheus" / "prometheus.yml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself for every target, with the target's labels."""
SCRAPE_LABELS = {"instance", "job"}
EVALUATION_TIMEOUT_S = 120.0
POLL_S = 0.5

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")


def rule_groups() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups()["groups"] for rule in group["rules"]]


def rule_ids() -> list[str]:
    return [rule["alert"] for rule in rules()]


def rule_tests() -> list[dict[str, Any]]:
    return yaml.safe_load(RULE_TESTS_FILE.read_text())["tests"]


def metric_name(selector: str) -> str:
    return selector.partition("{")[0].strip()


# -- the files alone ------------------------------------------------------------------------------
@needs_promtool
def test_promtool_accepts_the_rule_file() -> None:
    checked = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES_FILE)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_promtools_unit_tests_of_every_rule_pass() -> None:
    tested = subprocess.run(
        [str(PROMTOOL), "test", "rules", RULE_TESTS_FILE.name],
        cwd=RULE_TESTS_FILE.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize("alert", rule_ids())
def test_every_rule_is_tested_firing_and_not_firing(alert: str) -> None:
    cases = [case for test in rule_tests() for case in test["alert_rule_test"] if case["alertname"] == alert]

    assert any(case["exp_alerts"] for case in cases), f"no test of {alert} expects it to fire"
    assert any(not case["exp_alerts"] for case in cases), f"no test of {alert} expects it to stay quiet"


@pytest.mark.parametrize("rule", rules(), ids=rule_ids())
def test_every_rule_has_a_severity_a_summary_and_a_description(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_prometheus_loads_the_rules_from_where_compose_mounts_them() -> None:
    [rule_file] = yaml.safe_load(PROMETHEUS_FILE.read_text())["rule_files"]
    mount, inside = mount_for(load_compose()["services"]["prometheus"], Path(rule_file))

    assert (DEPLOY.parent / mount.source / inside).resolve() == RULES_FILE.resolve()


def test_the_kubernetes_prometheusrule_holds_the_same_groups() -> None:
    assert kubernetes_object("PrometheusRule")["spec"] == rule_groups()


# -- against a real node --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node(compose_models: Path) -> Iterator[ComposeNode]:
    """The compose ``udfserve-node`` service, serving tabular_mlp beside a model that cannot load."""
    models = Path(compose_models).parent / "alert-rules-models"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(compose_models / "tabular_mlp", models / "tabular_mlp")
    (models / "broken" / "1").mkdir(parents=True)
    (models / "broken" / "1" / "model.keras").write_bytes(b"this is not a keras file")
    yield from start_compose_node(load_compose(), "udfserve-node", models)


def predict_once(node: ComposeNode) -> None:
    [server] = node.discovery()["servers"]
    features = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(5 * 64, np.float32)), 64)
    message = pb.PredictRequest(
        model="tabular_mlp", batch_id=1, arrow_ipc=encode_batch(pa.record_batch({"features": features}))
    )
    with grpc.insecure_channel(f"unix://{server['unix_socket']}") as channel:
        [answer] = list(pb_grpc.InferenceStub(channel).Predict(iter([message]), timeout=60))
    assert not answer.HasField("error"), answer.error.message


def report_fallback_rows(node: ComposeNode) -> None:
    """Report rows as a Spark client whose CPU fallback answered them on the node does, so that
    the supervisor exports its fallback counter (it has series only once a client reported)."""
    folder = Path(node.discovery()["fallback_reports_dir"])
    add_fallback_rows(
        report_path(folder, os.geteuid(), os.getpid(), {}), "app-alert-rules", "tabular_mlp", 10
    )


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def series(node: ComposeNode) -> dict[str, set[str]]:
    """Sample name to label names over the node's scrapes, each with its target's labels (as
    Prometheus adds them), the GPU gauges as declared, and Prometheus's own ``up``."""
    predict_once(node)
    report_fallback_rows(node)
    target_labels = {t["labels"]["role"]: set(t["labels"]) | SCRAPE_LABELS for t in node.targets()}
    found: dict[str, set[str]] = {name: set().union(*target_labels.values()) for name in PROMETHEUS_OWN}
    scrapes = [(address, "model_server") for address in node.server_http_addresses()]
    scrapes.append((node.supervisor_address(), "supervisor"))
    for address, role in scrapes:
        for family in text_string_to_metric_families(scrape(address)):
            for sample in family.samples:
                found.setdefault(sample.name, set()).update(set(sample.labels) | target_labels[role])
    for name, labels in declared_gpu_series().items():
        found.setdefault(name, set()).update(labels | target_labels["model_server"])
    return found


def queried(rule: dict[str, Any]) -> set[str]:
    expression = rule["expr"]
    return promql_metric_names(expression) | {name for name in PROMETHEUS_OWN if f"{name}{{" in expression}


@pytest.mark.parametrize("rule", rules(), ids=rule_ids())
def test_every_metric_a_rule_queries_is_exported(rule: dict[str, Any], series: dict[str, set[str]]) -> None:
    names = queried(rule)

    assert names, f"{rule['alert']} queries no udfserve series: {rule['expr']}"
    assert not names - set(series), (
        f"{rule['alert']} queries {sorted(names - set(series))}, which no scrape has"
    )


@pytest.mark.parametrize("rule", rules(), ids=rule_ids())
def test_every_label_a_rule_uses_is_on_the_series_it_queries(
    rule: dict[str, Any], series: dict[str, set[str]]
) -> None:
    available = set().union(*(series.get(name, set()) for name in queried(rule)))
    templates = " ".join(rule["annotations"].values())
    used = promql_label_names(rule["expr"]) | {
        word.removeprefix("$labels.") for word in templates.split() if word.startswith("$labels.")
    }

    assert not used - available, (
        f"{rule['alert']} uses {sorted(used - available)}; the series carry {available}"
    )


@pytest.mark.parametrize("test", rule_tests(), ids=[test["name"][:60] for test in rule_tests()])
def test_the_rule_tests_feed_series_a_node_exports_with_their_labels(
    test: dict[str, Any], series: dict[str, set[str]]
) -> None:
    for given in test["input_series"]:
        selector = given["series"]
        name = metric_name(selector)
        assert name in series, f"the test feeds {name}, which no scrape has"
        labels = promql_label_names(selector)
        assert labels <= series[name], f"{selector}: labels {sorted(labels - series[name])} are on no scrape"


# -- in a real Prometheus -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["data"]


@pytest.fixture(scope="module")
def prometheus(node: ComposeNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping the node through its targets file (the advertised host, which
    resolves only on the compose network, dialled on 127.0.0.1) and evaluating alerts.yml every second."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (Debian: prometheus)")
    folder = tmp_path_factory.mktemp("prometheus")
    targets = [
        {**group, "targets": ["127.0.0.1:" + t.rpartition(":")[2] for t in group["targets"]]}
        for group in node.targets()
    ]
    (folder / "targets.json").write_text(json.dumps(targets))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES_FILE)],
        "scrape_configs": [
            {
                "job_name": "udfserve",
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(folder / "targets.json")]}],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={address}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://{address}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def firing(prometheus: str) -> list[dict[str, Any]]:
    """The alerts firing once the failed load's has: by then every rule was evaluated on scraped
    series (the rules run in one group, in order, every second)."""
    deadline = time.monotonic() + EVALUATION_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            alerts = get_json(f"{prometheus}/api/v1/alerts")["alerts"]
        except OSError:
            alerts = []  # not listening yet
        if any(
            a["labels"]["alertname"] == "UdfserveModelLoadFailed" and a["state"] == "firing" for a in alerts
        ):
            return alerts
        time.sleep(POLL_S)  # between looks at another process's state
    raise AssertionError(f"UdfserveModelLoadFailed did not fire within {EVALUATION_TIMEOUT_S:.0f} s")


def test_a_model_that_failed_to_load_raises_its_alert_in_prometheus(prometheus: str) -> None:
    [alert] = [a for a in firing(prometheus) if a["labels"]["alertname"] == "UdfserveModelLoadFailed"]

    assert {k: alert["labels"][k] for k in ("model", "version", "role", "severity")} == {
        "model": "broken",
        "version": "1",
        "role": "model_server",
        "severity": "warning",
    }
    assert alert["annotations"]["summary"].startswith("model broken version 1 failed to load on 127.0.0.1:")


def test_a_node_otherwise_healthy_raises_no_other_alert(prometheus: str) -> None:
    assert {a["labels"]["alertname"] for a in firing(prometheus)} == {"UdfserveModelLoadFailed"}


def test_every_rule_evaluates_without_error_on_the_nodes_series(prometheus: str) -> None:
    firing(prometheus)
    evaluated = [
        rule for group in get_json(f"{prometheus}/api/v1/rules")["groups"] for rule in group["rules"]
    ]

    assert sorted(rule["name"] for rule in evaluated) == sorted(rule_ids())
    assert {rule["name"]: rule.get("lastError", "") for rule in evaluated if rule["health"] != "ok"} == {}
