"""Leases of nodes started by Spark jobs: the lease files, the node's flags built by the client,
and the client's settings a ``node_servers`` context hands its UDFs. No sockets, no Spark."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, cast

import pytest

from udfserve.node_files import UntrustedNodeFile, trusted_uids
from udfserve.node_leases import Lease, lease_file, read_leases, write_lease
from udfserve.services.node.config import NodeConfig
from udfserve.services.settings_cli import SettingsError, add_settings_arguments, settings_from_args
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.node_start import NodeStart
from udfserve.spark_client.nodes.node_context import NodeServers
from udfserve.spark_client.nodes.node_ensure import node_environment
from udfserve.spark_client.nodes.routing import SPARK_CONF_NODE_START, apply_spark_conf

ME = frozenset({os.geteuid()})
NOBODY = 65534


def lease(number: int = 1) -> Lease:
    return Lease(
        lease_id=f"{number:032x}",
        holder_host="10.0.0.5",
        holder_port=40000 + number,
        application="app",
        created_at=1.0,
    )


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    return path


def node_config(argv: list[str]) -> NodeConfig:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, NodeConfig)
    return settings_from_args(NodeConfig, parser.parse_args(argv))


def test_a_written_lease_is_read_back_and_files_being_written_are_not(runtime_dir: Path) -> None:
    write_lease(runtime_dir, lease(1), ME, trusted_uids())
    write_lease(runtime_dir, lease(2), ME, trusted_uids())
    (runtime_dir / "leases" / f".{lease(3).lease_id}.tmp").write_text("{")

    reading = read_leases(runtime_dir, ME, trusted_uids())

    assert reading.leases == {lease(1).lease_id: lease(1), lease(2).lease_id: lease(2)}
    assert reading.refused == []
    assert (runtime_dir / "leases").stat().st_mode & 0o777 == 0o700
    assert lease_file(runtime_dir, lease(1).lease_id).stat().st_mode & 0o777 == 0o600


def test_a_runtime_folder_without_a_lease_folder_holds_no_lease(runtime_dir: Path) -> None:
    assert read_leases(runtime_dir, ME, trusted_uids()).leases == {}


def test_a_lease_file_others_may_write_or_under_another_name_is_refused(runtime_dir: Path) -> None:
    write_lease(runtime_dir, lease(1), ME, trusted_uids())
    os.chmod(lease_file(runtime_dir, lease(1).lease_id), 0o666)
    (runtime_dir / "leases" / f"{lease(2).lease_id}.json").write_text(lease(3).to_json())
    os.chmod(runtime_dir / "leases" / f"{lease(2).lease_id}.json", 0o600)

    reading = read_leases(runtime_dir, ME, trusted_uids())

    assert reading.leases == {}
    assert len(reading.refused) == 2
    assert "mode 0666: writable by others" in reading.refused[0]
    assert f"holds lease {lease(3).lease_id}, expected the file's name" in reading.refused[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user (chown) needs root")
def test_a_lease_folder_of_another_user_is_refused(runtime_dir: Path) -> None:
    write_lease(runtime_dir, lease(1), ME, trusted_uids())
    os.chown(runtime_dir / "leases", NOBODY, NOBODY)

    with pytest.raises(UntrustedNodeFile, match=r"the lease folder .* belongs to uid 65534"):
        read_leases(runtime_dir, ME, trusted_uids())


def test_the_node_flags_a_task_builds_are_the_ones_udfserve_node_reads(tmp_path: Path) -> None:
    start = NodeStart(
        model_repository=str(tmp_path),
        devices="sim:0,sim:1",
        models=("tabular_mlp",),
        runtime_dir=str(tmp_path / "rt"),
        node_args=("--supervisor-http-port", "7491", "--grace-period-s", "3"),
        lease=lease(),
        lease_poll_s=0.5,
        lease_timeout_s=4.0,
    )

    config = node_config(start.node_arguments(tmp_path / "rt", starter_lock_fd=7))

    assert (config.leases, config.lease_poll_s, config.lease_timeout_s, config.starter_lock_fd) == (
        True,
        0.5,
        4.0,
        7,
    )
    assert (config.devices, config.models, config.runtime_dir) == (
        "sim:0,sim:1",
        ("tabular_mlp",),
        tmp_path / "rt",
    )
    assert config.discovery_path == tmp_path / "rt" / "discovery.json"
    assert (config.supervisor_http_port, config.grace_period_s) == (7491, 3.0)  # node_args come last


def test_a_lease_timeout_under_two_polls_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError, match=r"lease_timeout_s \(1.0\) must be at least twice lease_poll_s \(2.0\)"
    ):
        node_config(["--model-repository", str(tmp_path), "--leases", "--lease-timeout-s", "1"])


def test_a_relative_model_repository_is_refused_in_the_driver() -> None:
    with pytest.raises(ValueError, match="must be an absolute path, the same on every host"):
        NodeStart(model_repository="models", lease=lease())


def test_udfs_built_in_the_context_take_its_node_start_from_the_spark_conf(tmp_path: Path) -> None:
    start = NodeStart(model_repository=str(tmp_path), lease=lease())

    config = apply_spark_conf(ClientConfig(), {SPARK_CONF_NODE_START: start.to_json()})

    assert config.node_start == start


def test_the_context_config_ensures_the_node_and_falls_back_on_the_contexts_repository(
    tmp_path: Path,
) -> None:
    start = NodeStart(
        model_repository=str(tmp_path / "models"), runtime_dir=str(tmp_path / "rt"), lease=lease()
    )
    nodes = NodeServers(spark=None, start=start, holder=cast(Any, None), executors=None, start_timeout_s=1)

    config = nodes.client_config(rows_per_request=100)
    own = nodes.client_config(ClientConfig(model_repository="/elsewhere", discovery_file="/x/discovery.json"))

    assert (config.node_start, config.rows_per_request) == (start, 100)
    assert config.model_repository == str(tmp_path / "models")
    assert config.discovery_file == str(tmp_path / "rt" / "discovery.json")
    assert (own.node_start, own.model_repository, own.discovery_file) == (
        start,
        "/elsewhere",
        "/x/discovery.json",
    )


def test_the_node_keeps_the_executors_settings_but_not_what_spark_set_for_one_python_worker() -> None:
    environ = {
        "UDFSERVE_RUNTIME_DIR": "/srv/udfserve",
        "PATH": "/usr/bin",
        "OMP_NUM_THREADS": "1",
        "PYTHON_WORKER_FACTORY_SECRET": "secret",
        "PYTHON_WORKER_FACTORY_SOCK_DIR": "/tmp/x",
        "SPARK_REUSE_WORKER": "1",
    }

    assert node_environment(environ) == {"UDFSERVE_RUNTIME_DIR": "/srv/udfserve", "PATH": "/usr/bin"}
