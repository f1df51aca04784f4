"""What a Spark task reads without pydantic: the job's ``TaskConfig``, the node's discovery file,
lease files and node start, each one plain record that its writer and its readers share, refused
with the field, what was expected and what was received."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from udfserve.discovery import DiscoveryError, NodeDiscovery, ServerEntry, read_discovery, write_discovery
from udfserve.node_leases import Lease
from udfserve.records import RecordError
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.common.task_config import TaskConfig

LEASE = Lease(lease_id="0123456789abcdef0123456789abcdef", holder_host="10.0.0.1", holder_port=7400)


def test_the_task_config_has_exactly_the_client_configs_fields() -> None:
    assert [item.name for item in dataclasses.fields(TaskConfig)] == list(ClientConfig.model_fields)


def test_the_task_config_carries_the_validated_values_and_the_node_start(tmp_path: Path) -> None:
    start = NodeStart(model_repository=str(tmp_path), lease=LEASE)
    config = ClientConfig(address="host:7500", rows_per_request=1024, node_start=start.to_json())

    task = config.task_config()

    assert (task.address, task.rows_per_request, task.node_start) == ("host:7500", 1024, start)
    assert task.tls_enabled is False


def test_the_task_side_modules_import_no_pydantic() -> None:
    """Every module a task runs, imported in a fresh interpreter, with a job's config unpickled."""
    code = (
        "import pickle, sys\n"
        "import udfserve.spark_client.executor.pandas_udf, udfserve.spark_client.executor.arrow_udf\n"
        "import udfserve.spark_client.nodes.node_ensure, udfserve.spark_client.nodes.host_start\n"
        "import udfserve.spark_client.wire.kserve_transport, udfserve.spark_client.api.file_reads\n"
        "pickle.loads(sys.stdin.buffer.read())\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'pydantic'))\n"
    )
    start = NodeStart(model_repository="/models", lease=LEASE)
    task = ClientConfig(auth_token="t", node_start=start).task_config()
    import pickle

    completed = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(task), capture_output=True, check=True, timeout=120
    )
    assert completed.stdout.decode().strip() == "[]"


def test_a_discovery_file_round_trips_through_its_writer_and_its_reader(tmp_path: Path) -> None:
    server = ServerEntry(device="gpu:0", device_index=0, unix_socket="/run/g0.sock", versions={"m": [1]})
    written = NodeDiscovery(node="n1", heartbeat_s=1.0, stale_after_s=5.0, servers=[server])
    write_discovery(tmp_path / "discovery.json", written)

    assert read_discovery(tmp_path / "discovery.json") == written


def test_fields_a_newer_node_writes_are_ignored(tmp_path: Path) -> None:
    text = json.dumps({"node": "n1", "later": 1, "servers": [{"device": "cpu", "later_too": True}]})
    assert NodeDiscovery.from_json(text).servers[0] == ServerEntry(device="cpu")


@pytest.mark.parametrize(
    ("servers", "refusal"),
    [
        ([{"device": 3}], r"servers\[0\]: ServerEntry.device: expected a string, received 3 \(int\)"),
        ([{}], r"servers\[0\]: missing fields \['device'\]"),
        ([{"device": "cpu", "state": "up"}], r"ServerEntry.state: expected one of \['starting', 'ready'"),
        ([{"device": "cpu", "versions": {"m": ["1"]}}], r"versions\['m'\]\[0\]: expected an integer"),
        ([{"device": "cpu", "pid": True}], r"ServerEntry.pid: expected an integer, received True"),
        ({"device": "cpu"}, r"NodeDiscovery.servers: expected a list"),
    ],
)
def test_a_discovery_file_with_a_wrong_field_is_refused_naming_it(
    tmp_path: Path, servers: object, refusal: str
) -> None:
    path = tmp_path / "discovery.json"
    path.write_text(json.dumps({"updated_at": time.time(), "servers": servers}))
    with pytest.raises(DiscoveryError, match=rf"discovery file {path} is not valid: .*{refusal}"):
        read_discovery(path)


def test_a_discovery_file_that_is_not_json_is_refused_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "discovery.json"
    path.write_text("{half")
    with pytest.raises(DiscoveryError, match="expected a JSON object, received text that is not JSON"):
        read_discovery(path)


def test_a_lease_round_trips_and_a_bad_one_is_refused_naming_the_field() -> None:
    assert Lease.from_json(LEASE.to_json()) == LEASE
    with pytest.raises(RecordError, match=r"Lease.lease_id: expected 32 lowercase hex digits, received 'x'"):
        Lease.from_json(json.dumps({**json.loads(LEASE.to_json()), "lease_id": "x"}))
    with pytest.raises(RecordError, match=r"Lease.holder_port: expected a port from 1 to 65535, received 0"):
        dataclasses.replace(LEASE, holder_port=0)


def test_a_node_start_round_trips_and_refuses_fields_it_does_not_know(tmp_path: Path) -> None:
    start = NodeStart(model_repository=str(tmp_path), lease=LEASE, models=("m",), node_args=("--x",))
    assert NodeStart.from_json(start.to_json()) == start
    with pytest.raises(RecordError, match=r"NodeStart: unknown fields \['devicez'\]"):
        NodeStart.from_json(json.dumps({**json.loads(start.to_json()), "devicez": "cpu"}))
    with pytest.raises(RecordError, match=r"NodeStart.lease_poll_s: expected seconds above 0, received 0"):
        dataclasses.replace(start, lease_poll_s=0)
