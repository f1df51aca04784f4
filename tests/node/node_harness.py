"""A real ``udfserve node`` process for the tests, and the small clients they use on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pyarrow as pa

from udfserve.discovery import DiscoveryError, NodeDiscovery, ServerEntry, read_discovery
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import encode_batch

T = TypeVar("T")

START_TIMEOUT_S = 240.0  # two servers importing TensorFlow on a busy two-core machine
CHANGE_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.05


class NodeExited(AssertionError):
    """The supervisor exited while a test was waiting on it."""


def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Return the first truthy value of ``condition()``; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)  # a short look between checks of a file written by another process


class NodeProcess:
    """``python -m udfserve node`` in a child process, logging to a file."""

    def __init__(
        self,
        runtime_dir: Path,
        repository: Path,
        devices: str,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env`` is added to this process's environment (less its ``UDFSERVE_*`` variables); the
        node's servers inherit it."""
        self.runtime_dir = runtime_dir
        self.discovery_path = runtime_dir / "discovery.json"
        self.targets_path = runtime_dir / "prometheus-targets.json"
        self.log_path = runtime_dir.parent / f"{runtime_dir.name}-supervisor.log"
        command = node_command(runtime_dir, repository, devices, extra)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("UDFSERVE_")}
        environment.update(env or {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def discovery(self) -> NodeDiscovery | None:
        self._fail_if_exited()
        try:
            return read_discovery(self.discovery_path)
        except DiscoveryError:
            return None

    def wait_for(self, condition: Callable[[NodeDiscovery], bool], what: str) -> NodeDiscovery:
        def check() -> NodeDiscovery | None:
            discovery = self.discovery()
            return discovery if discovery is not None and condition(discovery) else None

        return wait_until(check, CHANGE_TIMEOUT_S, what)

    def wait_all_ready(self, servers: int) -> NodeDiscovery:
        deadline_what = f"{servers} ready servers in {self.discovery_path}"

        def check() -> NodeDiscovery | None:
            discovery = self.discovery()
            if discovery is None or len(discovery.ready_servers()) != servers:
                return None
            return discovery

        return wait_until(check, START_TIMEOUT_S, deadline_what)

    def server(self, device: str) -> ServerEntry:
        discovery = self.discovery()
        assert discovery is not None, f"no discovery file at {self.discovery_path}"
        return entry_for(discovery, device)

    def supervisor_http_address(self) -> str:
        targets = json.loads(self.targets_path.read_text())
        [address] = [t["targets"][0] for t in targets if t["labels"]["role"] == "supervisor"]
        return address

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def _fail_if_exited(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise NodeExited(f"udfserve node exited with code {code}; its log:\n{self.log()[-4000:]}")


def node_command(runtime_dir: Path, repository: Path, devices: str, extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable, "-m", "udfserve", "node",
        "--model-repository", str(repository),
        "--devices", devices,
        "--runtime-dir", str(runtime_dir),
        "--supervisor-http-port", "0",
        "--grace-period-s", "5",
        "--models", "tabular_mlp",
        *extra,
    ]  # fmt: skip


def stop_node(node: NodeProcess) -> None:
    """Leave nothing running: the supervisor first, then any server it left behind."""
    discovery = node.discovery() if node.process.poll() is None else None
    node.terminate()
    for entry in discovery.servers if discovery else []:
        if entry.pid is not None and pid_exists(entry.pid):
            raise AssertionError(f"server pid {entry.pid} outlived its supervisor; log:\n{node.log()}")


def kill_if_still_running(pid: int | None, runtime_dir: Path) -> None:
    """SIGKILL ``pid`` if it is still a server of the node in ``runtime_dir`` (its command line
    names the folder): a pid that exited may since belong to another process."""
    if pid is None:
        return
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if str(runtime_dir).encode() in command:
        os.kill(pid, signal.SIGKILL)


def entry_for(discovery: NodeDiscovery, device: str) -> ServerEntry:
    matches = [s for s in discovery.servers if s.device == device]
    assert len(matches) == 1, f"expected one server on {device}, found {discovery.servers}"
    return matches[0]


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def predict_tabular(unix_socket: str, rows: int = 5, token: str | None = None) -> pb.PredictResponse:
    """One Predict on the example tabular model through the server's unix socket."""
    features = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(rows * 64, np.float32)), 64)
    payload = encode_batch(pa.record_batch({"features": features}))
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(f"unix://{unix_socket}") as channel:
        responses = list(
            pb_grpc.InferenceStub(channel).Predict(
                iter([pb.PredictRequest(model="tabular_mlp", batch_id=1, arrow_ipc=payload)]),
                timeout=60,
                metadata=metadata,
            )
        )
    assert len(responses) == 1 and not responses[0].HasField("error"), responses
    return responses[0]


def http_get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(address: str) -> str:
    status, text = http_get(address, "/metrics")
    assert status == 200, f"GET http://{address}/metrics answered {status}: {text[:500]}"
    return text


def samples(text: str, name: str) -> dict[frozenset[str], float]:
    """Every sample of metric ``name`` in a Prometheus text exposition, keyed by its label pairs."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric == name:
            found[frozenset(label_text.rstrip("}").split(",")) - {""}] = float(value)
    return found


def sample(text: str, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``; None when absent."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    matches = [value for key, value in samples(text, name).items() if wanted <= key]
    assert len(matches) <= 1, f"{len(matches)} samples of {name} match {labels}"
    return matches[0] if matches else None
