"""`udfserve node` on two simulated devices: discovery, restarts, metrics, the node lock."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

from node_harness import (
    NodeProcess,
    entry_for,
    node_command,
    pid_exists,
    predict_tabular,
    sample,
    samples,
    scrape,
)


def test_each_simulated_device_has_a_ready_server_in_the_discovery_file(two_device_node: NodeProcess) -> None:
    discovery = two_device_node.wait_all_ready(2)
    assert discovery.supervisor_pid == two_device_node.pid
    assert discovery.metrics_targets_file == str(two_device_node.targets_path)
    by_device = {s.device: s for s in discovery.servers}
    assert sorted(by_device) == ["sim:0", "sim:1"]
    for index, device in enumerate(["sim:0", "sim:1"]):
        entry = by_device[device]
        assert entry.device_index == index
        assert entry.unix_socket == str(two_device_node.runtime_dir / f"server-sim{index}.sock")
        assert entry.tcp_address and entry.http_address and entry.pid
        assert entry.models == ["tabular_mlp"]
    assert by_device["sim:0"].pid != by_device["sim:1"].pid


def test_a_killed_server_is_restarted_and_listed_again_with_a_new_pid(two_device_node: NodeProcess) -> None:
    node = two_device_node
    node.wait_all_ready(2)
    victim = node.server("sim:0")
    other = node.server("sim:1")
    supervisor = node.supervisor_http_address()
    restarts_before = sample(scrape(supervisor), "udfserve_server_restarts_total", device="sim:0")
    assert victim.pid is not None and restarts_before is not None

    os.kill(victim.pid, signal.SIGKILL)
    discovery = node.wait_for(
        lambda d: entry_for(d, "sim:0").state == "ready" and entry_for(d, "sim:0").pid != victim.pid,
        "sim:0 ready again with a new pid",
    )

    restarted = entry_for(discovery, "sim:0")
    assert not pid_exists(victim.pid)
    assert restarted.pid is not None and pid_exists(restarted.pid)
    assert restarted.models == ["tabular_mlp"]
    predict_tabular(restarted.unix_socket or "")
    assert entry_for(discovery, "sim:1") == other  # the other server was left alone
    metrics = scrape(node.supervisor_http_address())
    assert sample(metrics, "udfserve_server_restarts_total", device="sim:0") == restarts_before + 1
    assert sample(metrics, "udfserve_server_restarts_total", device="sim:1") == 0
    assert sample(metrics, "udfserve_server_ready", device="sim:0") == 1


def test_every_server_is_scraped_through_the_prometheus_targets_file(two_device_node: NodeProcess) -> None:
    discovery = two_device_node.wait_all_ready(2)
    for entry in discovery.servers:
        predict_tabular(entry.unix_socket or "")
    targets = json.loads(two_device_node.targets_path.read_text())

    servers = [t for t in targets if t["labels"]["role"] == "model_server"]
    assert sorted(t["labels"]["device"] for t in servers) == ["sim:0", "sim:1"]
    for target in servers:
        device = target["labels"]["device"]
        assert target["labels"]["device_index"] == device.removeprefix("sim:")
        assert target["targets"] == [entry_for(discovery, device).http_address]
        text = scrape(target["targets"][0])
        assert (sample(text, "udfserve_requests_total", model="tabular_mlp", code="OK") or 0) >= 1
        assert (sample(text, "udfserve_rows_total", model="tabular_mlp") or 0) >= 5
        assert sample(text, "udfserve_server_info", device=device) == 1
        assert sample(text, "udfserve_gpu_devices") == 0
        # no NVML here: the per-device GPU gauges are absent, not zero
        assert not samples(text, "udfserve_gpu_memory_used_bytes")
        assert not samples(text, "udfserve_gpu_utilization_ratio")
    [supervisor] = [t for t in targets if t["labels"]["role"] == "supervisor"]
    assert "udfserve_server_restarts_total" in scrape(supervisor["targets"][0])


def test_the_supervisor_compresses_its_metrics_for_a_scraper_that_accepts_gzip(
    two_device_node: NodeProcess,
) -> None:
    request = urllib.request.Request(
        f"http://{two_device_node.supervisor_http_address()}/metrics", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        encoding, body = response.headers["Content-Encoding"], response.read()

    assert encoding == "gzip"
    assert sample(gzip.decompress(body).decode(), "udfserve_server_ready", device="sim:0") is not None


def test_the_supervisor_exports_when_it_last_wrote_the_discovery_file(two_device_node: NodeProcess) -> None:
    metrics = scrape(two_device_node.supervisor_http_address())
    discovery = two_device_node.wait_all_ready(2)  # read after the scrape: written as late or later

    written = sample(metrics, "udfserve_discovery_last_write_timestamp_seconds")
    assert written is not None and written <= discovery.updated_at
    assert discovery.stale_after_s is not None
    assert discovery.updated_at - written <= discovery.stale_after_s
    assert sample(metrics, "udfserve_discovery_stale_after_seconds") == discovery.stale_after_s


def test_a_second_supervisor_on_the_same_runtime_dir_refuses_to_start(
    two_device_node: NodeProcess, tabular_onnx_repository: Path
) -> None:
    before = two_device_node.wait_all_ready(2)
    second = subprocess.run(
        node_command(two_device_node.runtime_dir, tabular_onnx_repository, "sim:0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode != 0
    lock = two_device_node.runtime_dir / "node.lock"
    assert f"pid {two_device_node.pid}" in second.stderr and str(lock) in second.stderr, second.stderr
    after = two_device_node.wait_all_ready(2)
    assert [s.pid for s in after.servers] == [s.pid for s in before.servers]


def test_a_supervisor_whose_http_port_is_taken_refuses_to_start_naming_the_setting(
    tabular_onnx_repository: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = node_command(tmp_path / "rt", tabular_onnx_repository, "sim:0")
        command[command.index("--supervisor-http-port") + 1] = str(port)
        refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert f"127.0.0.1:{port}" in refused.stderr and "--supervisor-http-port" in refused.stderr, (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr
