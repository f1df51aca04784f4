"""What the node publishes of each server's models and versions: read from the server's ready
file whenever the server rewrites it, written into the discovery file beside ``models``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from udfserve.discovery import NodeDiscovery, ServerEntry, read_discovery, write_discovery
from udfserve.services.node.ready_file import ReadyFileWatch, ServedModels


def write_ready_file(path: Path, versions: dict[str, list[int]]) -> None:
    """As a server writes it: every field, replaced atomically."""
    payload = {"pid": 1, "device": "sim:0", "unix_socket": "/s.sock", "tcp_address": None}
    payload |= {"http_address": None, "models": sorted(versions), "not_serving": "", "versions": versions}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def test_a_ready_file_gives_each_models_versions_in_order(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    write_ready_file(path, {"tabular_mlp": [3, 1], "multi_io": [1]})

    served = ReadyFileWatch(path).read()

    assert served == ServedModels(
        models=["multi_io", "tabular_mlp"], versions={"multi_io": [1], "tabular_mlp": [1, 3]}
    )


def test_a_rewritten_ready_file_is_read_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    write_ready_file(path, {"tabular_mlp": [1]})
    watch = ReadyFileWatch(path)
    watch.read()

    unchanged = watch.changed()
    write_ready_file(path, {"tabular_mlp": [2]})
    rewritten = watch.changed()

    assert unchanged is None
    assert rewritten is not None and rewritten.versions == {"tabular_mlp": [2]}
    assert watch.changed() is None


def test_a_ready_file_gone_or_half_written_is_left_for_the_next_look(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    write_ready_file(path, {"tabular_mlp": [1]})
    watch = ReadyFileWatch(path)
    watch.read()

    path.write_text('{"models": ["tabular_mlp"], "vers')
    half_written = watch.changed()
    write_ready_file(path, {"tabular_mlp": [2]})
    complete = watch.changed()
    path.unlink()

    assert half_written is None
    assert complete is not None and complete.versions == {"tabular_mlp": [2]}
    assert watch.changed() is None


def test_a_ready_file_of_a_server_without_versions_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text(json.dumps({"pid": 1, "device": "cpu", "models": ["tabular_mlp"]}))

    assert ReadyFileWatch(path).read() == ServedModels(models=["tabular_mlp"], versions={})


def test_the_discovery_file_lists_each_servers_versions_beside_its_models(tmp_path: Path) -> None:
    path = tmp_path / "discovery.json"
    entry = ServerEntry(
        device="sim:1", device_index=1, models=["tabular_mlp"], versions={"tabular_mlp": [1, 2]}
    )

    write_discovery(path, NodeDiscovery(node="n", servers=[entry]))

    assert json.loads(path.read_text())["servers"][0]["versions"] == {"tabular_mlp": [1, 2]}
    assert read_discovery(path).servers[0].versions == {"tabular_mlp": [1, 2]}


def test_a_discovery_file_without_versions_still_reads(tmp_path: Path) -> None:
    """Written by a supervisor from before versions were listed: still a valid file."""
    path = tmp_path / "discovery.json"
    server = {
        "device": "gpu:0",
        "device_index": 0,
        "unix_socket": "/s.sock",
        "models": ["m"],
        "state": "ready",
    }
    path.write_text(json.dumps({"schema_version": 1, "node": "n", "servers": [server]}))

    [entry] = read_discovery(path).ready_servers()

    assert (entry.models, entry.versions) == (["m"], {})
