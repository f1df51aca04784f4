"""Compose services run as plain processes: the same command and settings, container paths mapped
to temporary folders, fixed ports to free ones.

There is no Docker engine here, so a service's command is translated, not containerised:
``udfserve`` becomes this interpreter's ``-m udfserve``, ``/models`` and ``/run/udfserve`` become
temporary folders, fixed ports become 0 (the process picks a free one and announces it) and
``0.0.0.0`` becomes ``127.0.0.1`` so nothing listens beyond this machine. Every other flag and
variable is passed through unchanged, so an unknown or invalid one fails here as it would in
the container.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploy_files import argv_of, environment_of

START_TIMEOUT_S = 240.0  # a server importing TensorFlow and loading three models on a busy machine
POLL_INTERVAL_S = 0.05

CONTAINER_MODELS = "/models"
CONTAINER_RUNTIME = "/run/udfserve"
PORT_VARIABLES = {"UDFSERVE_SUPERVISOR_HTTP_PORT", "UDFSERVE_SERVER_HTTP_PORT_BASE"}
WILDCARD = "0.0.0.0"


def local_argv(argv: list[str]) -> list[str]:
    """``udfserve ...`` as this interpreter runs it."""
    assert argv[0] == "udfserve", argv
    return [sys.executable, "-m", "udfserve", *argv[1:]]


def translate_path(value: str, paths: dict[str, Path]) -> str:
    for container, local in paths.items():
        if value == container or value.startswith(container + "/"):
            return str(local) + value[len(container) :]
    return value


def child_environment(overrides: dict[str, str]) -> dict[str, str]:
    """This process's environment without any UDFSERVE_* variable, plus ``overrides``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("UDFSERVE_")}
    return env | overrides


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class ComposeNode:
    """A compose node service's command, run here with its compose environment."""

    def __init__(self, service_name: str, service: dict[str, Any], models: Path, workdir: Path) -> None:
        self.service_name = service_name
        self.runtime_dir = workdir / "rt"
        paths = {CONTAINER_MODELS: models, CONTAINER_RUNTIME: self.runtime_dir}
        env = {}
        for name, value in environment_of(service).items():
            if name in PORT_VARIABLES:
                value = "0"
            elif value == WILDCARD:
                value = "127.0.0.1"
            env[name] = translate_path(value, paths)
        self.environment = env
        self.argv = local_argv([translate_path(word, paths) for word in argv_of(service["command"])])
        self.log_path = workdir / "node.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=child_environment(env)
            )

    @property
    def targets_path(self) -> Path:
        return self.runtime_dir / "prometheus-targets.json"

    @property
    def discovery_path(self) -> Path:
        return self.runtime_dir / "discovery.json"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def targets(self) -> list[dict[str, Any]]:
        return json.loads(self.targets_path.read_text())

    def discovery(self) -> dict[str, Any]:
        return json.loads(self.discovery_path.read_text())

    def supervisor_address(self) -> str:
        """127.0.0.1 and the port the targets file gives the supervisor (it advertises another host)."""
        [target] = [t["targets"][0] for t in self.targets() if t["labels"]["role"] == "supervisor"]
        return "127.0.0.1:" + target.rpartition(":")[2]

    def _discovery_lists_every_server_ready(self) -> bool:
        try:
            servers = self.discovery()["servers"]
        except (OSError, ValueError):
            return False
        return bool(servers) and all(s["state"] == "ready" and s["http_address"] for s in servers)

    def server_http_addresses(self) -> list[str]:
        return [s["http_address"] for s in self.discovery()["servers"] if s["state"] == "ready"]

    def wait_ready(self) -> None:
        """Wait until the supervisor's /health/ready answers 200 and its discovery file lists every
        server ready with its addresses (the file is rewritten just after the health turns),
        failing early if the node exits."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = self.process.poll()
            if code is not None:
                raise AssertionError(f"{self.service_name} exited with code {code}; log:\n{self.log()}")
            if (
                self.targets_path.exists()
                and http_status(f"http://{self.supervisor_address()}/health/ready") == 200
                and self._discovery_lists_every_server_ready()
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.service_name} not ready after {START_TIMEOUT_S:.0f} s; log:\n{self.log()}"
                )
            time.sleep(POLL_INTERVAL_S)  # between looks at files and endpoints of another process

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def start_compose_node(compose: dict[str, Any], service_name: str, models: Path) -> Iterator[ComposeNode]:
    # unix socket paths are limited to about 100 bytes: pytest's tmp paths can be longer
    workdir = Path(tempfile.mkdtemp(prefix="udfd-"))
    node = ComposeNode(service_name, compose["services"][service_name], models, workdir)
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
