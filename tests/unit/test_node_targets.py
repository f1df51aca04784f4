"""The Prometheus file_sd targets the supervisor writes: one per server, one for itself."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from udfserve.discovery import ServerEntry
from udfserve.services.node.targets import advertised_address, server_target, supervisor_target, write_targets


def test_a_server_target_is_its_http_address_labelled_with_its_device() -> None:
    entry = ServerEntry(device="gpu:1", device_index=1, device_uuid="GPU-bbbb", http_address="127.0.0.1:9101")

    assert server_target(entry, "node-a", None) == {
        "targets": ["127.0.0.1:9101"],
        "labels": {
            "node": "node-a",
            "role": "model_server",
            "device": "gpu:1",
            "device_index": "1",
            "device_uuid": "GPU-bbbb",
        },
    }


def test_a_cpu_server_target_has_no_device_index_or_uuid_label() -> None:
    entry = ServerEntry(device="cpu", http_address="127.0.0.1:9101")

    assert server_target(entry, "n", None)["labels"] == {"node": "n", "role": "model_server", "device": "cpu"}


def test_the_supervisor_is_its_own_target() -> None:
    assert supervisor_target("127.0.0.1:7490", "n", None) == {
        "targets": ["127.0.0.1:7490"],
        "labels": {"node": "n", "role": "supervisor"},
    }


def test_a_wildcard_bind_is_advertised_under_the_host_name_unless_a_host_is_given() -> None:
    assert advertised_address("0.0.0.0:9101", None) == f"{socket.gethostname()}:9101"
    assert advertised_address("0.0.0.0:9101", "10.0.0.7") == "10.0.0.7:9101"
    assert advertised_address("127.0.0.1:9101", None) == "127.0.0.1:9101"


def test_the_targets_file_is_replaced_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "prometheus-targets.json"
    write_targets(path, [supervisor_target("127.0.0.1:1", "n", None)])
    write_targets(path, [supervisor_target("127.0.0.1:2", "n", None)])

    assert json.loads(path.read_text())[0]["targets"] == ["127.0.0.1:2"]
    assert [p.name for p in tmp_path.iterdir()] == ["prometheus-targets.json"]
