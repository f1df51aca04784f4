"""The container cluster's compose files (deploy/cluster/), read the way Compose reads them.

The node file's services depend on variables (the node's name, the images), which Compose
interpolates before anything else; ``interpolated`` does the same for the forms the files use
(``${NAME}``, ``${NAME:-default}``, ``${NAME:?message}``, ``$$``), so that the tests read the values
a node really gets.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from deploy_files import DEPLOY

CLUSTER_DIR = DEPLOY / "cluster"
CLUSTER_FILE = CLUSTER_DIR / "cluster.yml"
NODE_FILE = CLUSTER_DIR / "node.yml"
LAYOUTS = {
    "daemonset": {"host", "udfserve-node", "spark-worker"},
    "init-script": {"host", "spark-worker-init"},
    "job": {"host", "spark-worker-job"},
}
"""Each layout (a profile of the node file) and the services a node of it runs."""
WORKERS = {"daemonset": "spark-worker", "init-script": "spark-worker-init", "job": "spark-worker-job"}
NODE_RUNNERS = {"daemonset": "udfserve-node", "init-script": "spark-worker-init"}
"""The service whose container runs `udfserve node`, where one is started at the node's boot."""
NODE_NAME = "node7"

_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


class MissingVariable(ValueError):
    """A ``${NAME:?message}`` whose variable is not set."""


def interpolated(value: Any, environment: dict[str, str]) -> Any:
    """``value`` with its variables replaced as Compose replaces them."""
    if isinstance(value, dict):
        return {key: interpolated(item, environment) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolated(item, environment) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, argument = match["name"], match["op"], match["arg"]
        if environment.get(name):
            return environment[name]
        if op == ":?":
            raise MissingVariable(f"{name}: {argument}")
        return argument if op == ":-" else ""

    return _VARIABLE.sub(replace, value)


def load_cluster(environment: dict[str, str] | None = None) -> dict[str, Any]:
    environment = {"UDFSERVE_CLUSTER_TARGETS": "/srv/targets", **(environment or {})}
    return interpolated(yaml.safe_load(CLUSTER_FILE.read_text()), environment)


def load_node(environment: dict[str, str] | None = None) -> dict[str, Any]:
    environment = {"UDFSERVE_CLUSTER_NODE": NODE_NAME, **(environment or {})}
    return interpolated(yaml.safe_load(NODE_FILE.read_text()), environment)


def bind_source(service_file: Path, source: str) -> Path:
    """A bind mount's source as Compose resolves it: relative to the compose file's folder."""
    return (service_file.parent / source).resolve()
