"""Reading the deployment files the way Docker Compose, Docker and Kubernetes read them, as far as
the tests need: compose services under profiles, their commands and mounts, Dockerfile
instructions, multi-document Kubernetes YAML, PromQL metric and label names.

No Docker engine or cluster runs here, so these helpers are what the tests check the files with;
each is small enough to be read against the format it parses.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.node.config import NodeConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = {
    "udfserve": "udfserve",
    "services": "udfserve/services",
    "spark_client": "udfserve/spark_client",
}
"""The folders the package is built from, each with where it lands in an install (setup.py)."""
BUILD_FILES = ("pyproject.toml", "setup.py")
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOTENV_FILE = ROOT / ".env"
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
DASHBOARD_FILE = DEPLOY / "grafana" / "dashboards" / "udfserve.json"
GPU_METRICS_SOURCE = ROOT / "services" / "model_server" / "observability" / "gpu_metrics.py"

NODE_SERVICES = ("udfserve-node", "udfserve-node-cpu")


# -- compose ----------------------------------------------------------------------------------


def load_compose() -> dict[str, Any]:
    with COMPOSE_FILE.open() as handle:
        return yaml.safe_load(handle)


def dotenv() -> dict[str, str]:
    """``KEY=value`` lines of the ``.env`` file Compose reads beside the compose file."""
    values = {}
    for line in DOTENV_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def active_services(compose: dict[str, Any], profiles: set[str]) -> set[str]:
    """Services Compose starts with these profiles enabled: those without profiles, and matches."""
    return {
        name
        for name, service in compose["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def argv_of(value: str | list[str] | None) -> list[str]:
    """A compose ``command``/``entrypoint``: a list as is, a string split the way Compose splits it."""
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool

    @property
    def is_bind(self) -> bool:
        return self.source.startswith((".", "/"))


def mounts_of(service: dict[str, Any]) -> list[Mount]:
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts.append(Mount(volume["source"], volume["target"], bool(volume.get("read_only"))))
            continue
        parts = volume.split(":")
        mounts.append(Mount(parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return mounts


def mount_for(service: dict[str, Any], path: Path) -> tuple[Mount, Path]:
    """The mount that holds ``path`` inside the container, and the path relative to the mount."""
    for mount in sorted(mounts_of(service), key=lambda m: -len(m.target)):
        try:
            return mount, path.relative_to(mount.target)
        except ValueError:
            continue
    raise AssertionError(f"no volume of the service holds {path}; mounts: {mounts_of(service)}")


@dataclass(frozen=True)
class PublishedPort:
    host_ip: str
    host_port: int
    container_port: int


def published_ports(service: dict[str, Any]) -> list[PublishedPort]:
    ports = []
    for spec in service.get("ports") or []:
        parts = str(spec).split(":")
        if len(parts) != 3:
            raise AssertionError(
                f"port {spec!r} does not name the host address: expected 'ip:host:container'"
            )
        ports.append(PublishedPort(parts[0], int(parts[1]), int(parts[2].split("/")[0])))
    return ports


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: {"condition": "service_started", "required": True} for name in value}
    return value


def node_settings(compose: dict[str, Any], service_name: str) -> tuple[dict[str, str], argparse.Namespace]:
    """The node service's UDFSERVE_* environment and its parsed ``udfserve node`` command."""
    service = compose["services"][service_name]
    args = parse_udfserve(argv_of(service["command"]))
    assert args.command == "node", f"{service_name} runs `{' '.join(argv_of(service['command']))}`"
    return environment_of(service), args


def node_config(env: dict[str, str], args: argparse.Namespace, model_repository: Path) -> NodeConfig:
    """The NodeConfig this environment and these flags make, with the repository at a local path.

    Built from explicit values (flags over variables, as ``udfserve node`` does) so that the
    environment of the test process plays no part.
    """
    values: dict[str, Any] = {}
    for name, value in env.items():
        field = settings_field(name)
        if field in NodeConfig.model_fields:
            values[field] = value
    for field in NodeConfig.model_fields:
        if getattr(args, field, None) is not None:
            values[field] = getattr(args, field)
    values["model_repository"] = model_repository
    return NodeConfig(**values)


def first_server_config(node: NodeConfig) -> ServerConfig:
    """The settings of the first server this node starts, its whole ``udfserve serve`` command line
    read as the server reads it (``check_server_command``): what its flags and --server-args make."""
    from udfserve.services.node.devices import DeviceSlot
    from udfserve.services.node.server_flags import check_server_command
    from udfserve.services.node.server_slot import ServerSlot

    return check_server_command(ServerSlot(DeviceSlot("cpu"), 0, node).serve_arguments(node))


# -- the CLI ----------------------------------------------------------------------------------


def parse_udfserve(argv: list[str]) -> argparse.Namespace:
    """``udfserve ...`` parsed by the real CLI parser; an unknown flag fails with argparse's message."""
    assert argv and argv[0] == "udfserve", f"expected a `udfserve` command, received {argv}"
    parser = build_parser()
    try:
        return parser.parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(
            f"`{shlex.join(argv)}` is not accepted by the udfserve CLI (exit {exc.code})"
        ) from None


def cli_commands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("the udfserve parser has no sub-commands")


def settings_field(variable: str) -> str:
    assert variable.startswith("UDFSERVE_"), variable
    return variable.removeprefix("UDFSERVE_").lower()


def known_settings_variables() -> set[str]:
    """Every UDFSERVE_* variable a udfserve process reads: server and node settings, client lookups."""
    from udfserve.discovery import DISCOVERY_FILE_ENV, RUNTIME_DIR_ENV
    from udfserve.spark_client.nodes.routing import ADDRESS_ENV

    fields = set(ServerConfig.model_fields) | set(NodeConfig.model_fields)
    return {f"UDFSERVE_{f.upper()}" for f in fields} | {ADDRESS_ENV, DISCOVERY_FILE_ENV, RUNTIME_DIR_ENV}


def admin_app_paths() -> set[str]:
    """Paths the model server's HTTP admin app serves (its routes built by the real factory)."""
    import asyncio

    from udfserve.services.model_server.core.model_table import ModelTable
    from udfserve.services.model_server.frontends.admin_server import ServingLoop
    from udfserve.services.model_server.frontends.http_api import admin_routes
    from udfserve.services.model_server.observability.metrics import ServerMetrics

    config = ServerConfig(model_repository=Path("unused"), socket=Path("unused.sock"), port=None)
    metrics = ServerMetrics(config.device)
    loop = asyncio.new_event_loop()
    try:
        app = admin_routes(ModelTable(config, metrics), metrics, config.device, ServingLoop(loop))
    finally:
        loop.close()
    return {route.path for route in app.routes}


# -- Dockerfiles ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int

    def words(self) -> list[str]:
        """Arguments in exec form (a JSON list) or shell form, split into words."""
        text = self.arguments.strip()
        if text.startswith("["):
            return [str(word) for word in json.loads(text)]
        return shlex.split(text)


def dockerfile_instructions(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, arguments = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return instructions


def copy_sources(instruction: Instruction) -> list[str]:
    """The build-context paths a COPY reads; none for a copy from an earlier stage (--from)."""
    if any(w.startswith("--from=") for w in instruction.words()):
        return []
    words = [w for w in instruction.words() if not w.startswith("--")]
    return words[:-1]


# -- Kubernetes -------------------------------------------------------------------------------


def kubernetes_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        with path.open() as handle:
            for document in yaml.safe_load_all(handle):
                if document is not None:
                    yield path, document


def kubernetes_object(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for _, doc in kubernetes_documents()
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {KUBERNETES}, found {len(found)}"
    return found[0]


# -- PromQL -----------------------------------------------------------------------------------

_METRIC = re.compile(r"\budfserve_[a-z0-9_]+\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"\{([^{}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def promql_metric_names(expression: str) -> set[str]:
    return set(_METRIC.findall(expression))


def promql_label_names(expression: str) -> set[str]:
    """Label names an expression groups by or matches on."""
    labels = set()
    for group in _GROUPING.findall(expression):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    for selector in _SELECTOR.findall(expression):
        labels |= set(_MATCHER.findall(selector))
    return labels


def legend_label_names(legend: str) -> set[str]:
    return set(_LEGEND_LABEL.findall(legend))


def exposition_series(text: str) -> dict[str, set[str]]:
    """Metric name to the label names it carries, from a Prometheus text exposition."""
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head = line.rpartition(" ")[0]
        name, _, labels = head.partition("{")
        names = {pair.split("=", 1)[0] for pair in labels.rstrip("}").split(",") if "=" in pair}
        series.setdefault(name, set()).update(names)
    return series


def declared_gpu_series() -> dict[str, set[str]]:
    """Metric names ("udfserve_gpu_...") in gpu_metrics.py, each with the labels DEVICE_LABELS declares."""
    tree = ast.parse(GPU_METRICS_SOURCE.read_text())
    names = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("udfserve_gpu_")
    }
    [labels] = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DEVICE_LABELS" for t in node.targets)
    ]
    return {name: set() if name == "udfserve_gpu_devices" else set(labels) for name in names}
