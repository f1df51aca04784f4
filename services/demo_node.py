"""The node `udfserve demo` starts, and what the demo reads from it: its servers' metrics.

The node runs in a private runtime folder with free ports, in a session of its own, and is
stopped (SIGTERM, then its folder removed) when the demo leaves; with ``--keep-running`` the
demo waits for Ctrl-C or SIGTERM first, so the node's addresses stay valid while it prints them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

from udfserve.discovery import DiscoveryError, NodeDiscovery, read_discovery

logger = logging.getLogger(__name__)


class DemoError(RuntimeError):
    """The demo could not run; the message says which step failed and why."""


@dataclass(frozen=True)
class StartedNode:
    """The node the demo started: its process, discovery file and log (gone once it stopped)."""

    process: subprocess.Popen[bytes]
    discovery_file: Path
    log_path: Path


@contextlib.contextmanager
def running_node(
    model_repository: Path, devices: str, start_timeout_s: float, extra_args: Sequence[str] = ()
) -> Iterator[StartedNode]:
    """Start `udfserve node` in a private runtime folder (``extra_args``: more of its flags);
    yield it once its servers are ready; stop it and remove the folder after.

    The node runs in a session of its own: Ctrl-C in the terminal reaches the demo alone, which
    then stops the node itself, instead of both racing to stop its servers.
    """
    runtime_dir = Path(tempfile.mkdtemp(prefix="udfserve-demo-"))
    discovery_file = runtime_dir / "discovery.json"
    log_path = runtime_dir / "node.log"
    command = [
        sys.executable,
        "-m",
        "udfserve",
        "node",
        "--model-repository",
        str(model_repository),
        "--devices",
        devices,
        "--runtime-dir",
        str(runtime_dir),
        "--supervisor-http-port",
        "0",
        "--log-level",
        "WARNING",
        *extra_args,
    ]
    logger.info(
        "step 2/4: starting `udfserve node --devices %s` (its log: %s, removed with the node)",
        devices,
        log_path,
    )
    with open(log_path, "ab") as log:
        node = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_ready_servers(node, discovery_file, log_path, start_timeout_s)
        yield StartedNode(node, discovery_file, log_path)
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        shutil.rmtree(runtime_dir, ignore_errors=True)


def wait_for_ready_servers(
    node: subprocess.Popen[bytes], path: Path, log_path: Path, timeout_s: float
) -> None:
    # The supervisor writes the discovery file atomically once a server is healthy; re-reading
    # it every half second costs nothing next to the seconds a server takes to load TensorFlow.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise DemoError(f"`udfserve node` exited with code {node.returncode}:\n{tail}")
        with contextlib.suppress(DiscoveryError):
            discovery = read_discovery(path)
            if discovery.servers and len(discovery.ready_servers()) == len(discovery.servers):
                return
        time.sleep(0.5)
    raise DemoError(f"`udfserve node` had no ready server after {timeout_s:.0f} s (log: {log_path})")


def metrics_addresses(discovery: NodeDiscovery) -> list[str]:
    """host:port of every model server's /metrics, as Prometheus reaches them.

    The targets file carries the advertised addresses (reachable from other containers of a
    compose stack); the discovery file's addresses are the bound ones, right on the same host.
    """
    if discovery.metrics_targets_file:
        with contextlib.suppress(OSError, ValueError):
            groups = json.loads(Path(discovery.metrics_targets_file).read_text(encoding="utf-8"))
            return [
                target
                for group in groups
                if group.get("labels", {}).get("role") == "model_server"
                for target in group.get("targets", [])
            ]
    return [s.http_address for s in discovery.servers if s.http_address]


SHARED_MEMORY_REQUESTS = "udfserve_shared_memory_requests_total"


def scrape_total(discovery: NodeDiscovery, metric: str, model: str | None) -> float:
    """Sum of one metric over every server of the node, read from their /metrics: the series of
    ``model``, or the unlabelled one when ``model`` is None."""
    total = 0.0
    for address in metrics_addresses(discovery):
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            total += sample_total(response.read().decode(), metric, model)
    return total


def sample_total(exposition: str, metric: str, model: str | None) -> float:
    """Sum of the samples named ``metric`` (``udfserve_rows_total``, ``..._seconds_sum``) in one
    Prometheus text exposition, read by prometheus_client's parser: those of ``model``, or those
    without a model label when ``model`` is None."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == metric and sample.labels.get("model") == model
    )


def node_addresses(discovery: NodeDiscovery) -> list[str]:
    """Where to look at a running node: every server's /metrics, the supervisor's, the targets file."""
    lines = [f"metrics                http://{a}/metrics" for a in metrics_addresses(discovery)]
    if discovery.metrics_targets_file:
        with contextlib.suppress(OSError, ValueError):
            groups = json.loads(Path(discovery.metrics_targets_file).read_text(encoding="utf-8"))
            lines += [
                f"supervisor             http://{target}/metrics, http://{target}/health/ready"
                for group in groups
                if group.get("labels", {}).get("role") == "supervisor"
                for target in group.get("targets", [])
            ]
        lines.append(f"prometheus targets     {discovery.metrics_targets_file}")
    return lines


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so either stops the node the demo
    keeps running through the same clean-up; the previous handler is restored after."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until_interrupted(node: StartedNode, discovery: NodeDiscovery, out: TextIO) -> None:
    """Print where to look at the node, and keep it up until Ctrl-C (or SIGTERM); a node that
    exits by itself meanwhile is an error."""
    lines = ["", "the node keeps running until Ctrl-C:", *node_addresses(discovery)]
    lines.append(f"node log               {node.log_path}")
    with sigterm_as_interrupt():
        try:
            out.write("\n".join(lines) + "\n")
            out.flush()
            code = node.process.wait()
        except KeyboardInterrupt:
            logger.info("step 4/4: stopping the node")
            return
    tail = node.log_path.read_text(errors="replace")[-3000:]
    raise DemoError(f"`udfserve node` exited by itself with code {code}:\n{tail}")
