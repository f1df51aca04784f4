"""How a task finds its model server: pure functions of config, environment and placement."""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from udfserve.discovery import (
    DISCOVERY_FILE_ENV,
    RUNTIME_DIR_ENV,
    NodeDiscovery,
    ServerEntry,
    write_discovery,
)
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.nodes.routing import (
    ADDRESS_ENV,
    SPARK_CONF_ADDRESS,
    SPARK_CONF_AUTH_TOKEN,
    SPARK_CONF_AUTH_TOKEN_FILE,
    SPARK_CONF_DISCOVERY_FILE,
    SPARK_CONF_MODEL_REPOSITORY,
    SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE,
    SPARK_CONF_TLS_CLIENT_KEY_FILE,
    SPARK_CONF_TLS_ROOT_CERTIFICATES_FILE,
    NoServerFound,
    TaskPlacement,
    apply_spark_conf,
    choose_server,
    discovery_path,
    fallback_repository,
    placement_from_resources,
    resolve_route,
)

RUN = Path(tempfile.mkdtemp(prefix="udfs-routing-"))
"""The node's runtime folder in these tests: this user's, 0700, so its sockets pass the client's
ownership checks (tests/unit/test_node_files.py tests those); the sockets themselves are absent."""
atexit.register(shutil.rmtree, RUN, ignore_errors=True)


def gpu_server(index: int, state: str = "ready") -> ServerEntry:
    return ServerEntry(
        device=f"gpu:{index}",
        device_index=index,
        unix_socket=f"{RUN}/gpu{index}.sock",
        tcp_address=f"127.0.0.1:{7500 + index}",
        state=state,  # type: ignore[arg-type]
    )


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    path = tmp_path / "discovery.json"
    servers = [gpu_server(1), gpu_server(0), gpu_server(2, state="restarting")]
    write_discovery(path, NodeDiscovery(model_repository="/models", servers=servers))
    return path


def test_an_explicit_address_beats_the_environment_and_the_discovery_file(node_file: Path) -> None:
    config = ClientConfig(address="unix:///tmp/explicit.sock", discovery_file=str(node_file))
    route = resolve_route(config, {ADDRESS_ENV: "10.0.0.1:7500"}, TaskPlacement())
    assert route.targets == ("unix:///tmp/explicit.sock",)


def test_the_spark_conf_address_is_frozen_into_the_config_unless_one_is_given() -> None:
    conf = {SPARK_CONF_ADDRESS: "10.0.0.2:7500", SPARK_CONF_DISCOVERY_FILE: "/etc/d.json"}
    assert apply_spark_conf(ClientConfig(), conf).address == "10.0.0.2:7500"
    assert apply_spark_conf(ClientConfig(), conf).discovery_file == "/etc/d.json"
    assert apply_spark_conf(ClientConfig(address="host:1"), conf).address == "host:1"


def test_the_spark_conf_model_repository_fills_an_unset_one() -> None:
    conf = {SPARK_CONF_MODEL_REPOSITORY: "/shared/models"}
    assert apply_spark_conf(ClientConfig(), conf).model_repository == "/shared/models"
    assert apply_spark_conf(ClientConfig(model_repository="/mine"), conf).model_repository == "/mine"


def test_the_spark_conf_token_and_tls_files_fill_an_unset_config() -> None:
    conf = {
        SPARK_CONF_AUTH_TOKEN: "t0ken",
        SPARK_CONF_TLS_ROOT_CERTIFICATES_FILE: "/etc/udfserve/ca.pem",
        SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE: "/etc/udfserve/client.pem",
        SPARK_CONF_TLS_CLIENT_KEY_FILE: "/etc/udfserve/client.key",
    }
    config = apply_spark_conf(ClientConfig(), conf)
    assert config.auth_token is not None and config.auth_token.get_secret_value() == "t0ken"
    assert (config.tls_root_certificates_file, config.tls_client_key_file) == (
        "/etc/udfserve/ca.pem",
        "/etc/udfserve/client.key",
    )


def test_a_token_given_to_the_udf_beats_both_token_keys_of_the_spark_conf() -> None:
    conf = {SPARK_CONF_AUTH_TOKEN: "from-conf", SPARK_CONF_AUTH_TOKEN_FILE: "/conf/token"}
    config = apply_spark_conf(ClientConfig(auth_token_file="/mine/token"), conf)
    assert (config.auth_token, config.auth_token_file) == (None, "/mine/token")


def test_a_token_file_in_the_spark_conf_beats_a_token_value_there() -> None:
    conf = {SPARK_CONF_AUTH_TOKEN: "from-conf", SPARK_CONF_AUTH_TOKEN_FILE: "/conf/token"}
    config = apply_spark_conf(ClientConfig(), conf)
    assert (config.auth_token, config.auth_token_file) == (None, "/conf/token")


def test_an_incomplete_mutual_tls_spark_conf_is_refused_naming_the_keys() -> None:
    with pytest.raises(ValueError, match=SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE):
        apply_spark_conf(ClientConfig(), {SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE: "/etc/client.pem"})


def test_an_invalid_spark_conf_address_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=SPARK_CONF_ADDRESS):
        apply_spark_conf(ClientConfig(), {SPARK_CONF_ADDRESS: "not a target"})


def test_the_spark_conf_turns_shared_memory_off_and_names_its_folder_unless_the_udf_set_them() -> None:
    conf = {"spark.udfserve.sharedMemory": "false", "spark.udfserve.sharedMemoryDir": "/run/udfserve-shm"}
    filled = apply_spark_conf(ClientConfig(), conf)
    assert (filled.shared_memory, filled.shared_memory_dir) == (False, "/run/udfserve-shm")
    kept = apply_spark_conf(ClientConfig(shared_memory=True, shared_memory_dir="/dev/shm"), conf)
    assert (kept.shared_memory, kept.shared_memory_dir) == (True, "/dev/shm")


def test_the_spark_conf_shares_payload_files_with_the_group_unless_the_udf_said_otherwise() -> None:
    conf = {"spark.udfserve.sharedMemoryGroupAccess": "true"}
    assert apply_spark_conf(ClientConfig(), conf).shared_memory_group_access is True
    kept = apply_spark_conf(ClientConfig(shared_memory_group_access=False), conf)
    assert kept.shared_memory_group_access is False


def test_an_invalid_spark_conf_shared_memory_switch_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"(?s)spark\.udfserve\.sharedMemory.*valid boolean"):
        apply_spark_conf(ClientConfig(), {"spark.udfserve.sharedMemory": "maybe"})


def test_the_executor_environment_address_beats_the_discovery_file(node_file: Path) -> None:
    config = ClientConfig(discovery_file=str(node_file))
    route = resolve_route(config, {ADDRESS_ENV: "10.0.0.1:7500"}, TaskPlacement())
    assert route.targets == ("10.0.0.1:7500",)
    assert ADDRESS_ENV in route.origin


def test_an_invalid_environment_address_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=ADDRESS_ENV):
        resolve_route(ClientConfig(), {ADDRESS_ENV: "no port here"}, TaskPlacement())


def test_a_task_with_a_gpu_takes_the_server_of_that_device(node_file: Path) -> None:
    config = ClientConfig(discovery_file=str(node_file))
    route = resolve_route(config, {}, TaskPlacement(partition_id=0, gpu_addresses=("1",)))
    assert route.targets == (f"unix://{RUN}/gpu1.sock", "127.0.0.1:7501")
    assert "gpu:1" in route.origin


def test_the_node_s_other_ready_servers_follow_as_alternates(node_file: Path) -> None:
    route = resolve_route(
        ClientConfig(discovery_file=str(node_file)), {}, TaskPlacement(gpu_addresses=("1",))
    )
    assert route.alternates == (f"unix://{RUN}/gpu0.sock", "127.0.0.1:7500")  # gpu:2 is restarting


def test_an_explicit_address_has_no_alternates() -> None:
    route = resolve_route(ClientConfig(address="host:7500"), {}, TaskPlacement())
    assert route.alternates == ()


def test_a_task_with_several_gpus_takes_the_server_of_the_first(node_file: Path) -> None:
    route = resolve_route(
        ClientConfig(discovery_file=str(node_file)),
        {},
        TaskPlacement(partition_id=1, gpu_addresses=("0", "1")),
    )
    assert route.targets[0] == f"unix://{RUN}/gpu0.sock"


def test_a_gpu_without_a_ready_server_falls_back_to_round_robin(node_file: Path) -> None:
    discovery = NodeDiscovery.from_json(node_file.read_text())
    chosen = choose_server(discovery, TaskPlacement(partition_id=3, gpu_addresses=("2",)), node_file)
    assert chosen.device == "gpu:1"  # gpu:2 is restarting; partition 3 of the ready [gpu:0, gpu:1]


def test_tasks_without_gpus_spread_round_robin_over_ready_servers_in_device_order(node_file: Path) -> None:
    discovery = NodeDiscovery.from_json(node_file.read_text())
    devices = [choose_server(discovery, TaskPlacement(partition_id=p), node_file).device for p in range(5)]
    assert devices == ["gpu:0", "gpu:1", "gpu:0", "gpu:1", "gpu:0"]


def test_devices_are_ordered_by_index_not_by_text() -> None:
    discovery = NodeDiscovery(servers=[gpu_server(10), gpu_server(2)])
    assert choose_server(discovery, TaskPlacement(partition_id=0), "f").device == "gpu:2"


def test_the_unix_socket_is_dialled_first_unless_told_otherwise(node_file: Path) -> None:
    placement = TaskPlacement(gpu_addresses=("0",))
    preferred = resolve_route(ClientConfig(discovery_file=str(node_file)), {}, placement)
    tcp_first = resolve_route(
        ClientConfig(discovery_file=str(node_file), prefer_unix_socket=False), {}, placement
    )
    assert preferred.targets == (f"unix://{RUN}/gpu0.sock", "127.0.0.1:7500")
    assert tcp_first.targets == ("127.0.0.1:7500", f"unix://{RUN}/gpu0.sock")


def kserve_node_file(tmp_path: Path, kserve_socket: str) -> Path:
    path = tmp_path / "d.json"
    server = dataclasses.replace(gpu_server(0), kserve_socket=kserve_socket)
    write_discovery(path, NodeDiscovery(servers=[server]))
    return path


def test_protocol_kserve_dials_the_published_kserve_socket_first(tmp_path: Path) -> None:
    path = kserve_node_file(tmp_path, f"{RUN}/kserve-gpu0.sock")
    preferred = resolve_route(ClientConfig(discovery_file=str(path), protocol="kserve"), {}, TaskPlacement())
    tcp_first = resolve_route(
        ClientConfig(discovery_file=str(path), protocol="kserve", prefer_unix_socket=False),
        {},
        TaskPlacement(),
    )
    sockets = (f"unix://{RUN}/kserve-gpu0.sock", f"unix://{RUN}/gpu0.sock")
    assert preferred.targets == (*sockets, "127.0.0.1:7500")
    assert tcp_first.targets == ("127.0.0.1:7500", *sockets)
    assert preferred.server_of(sockets[0]) == preferred.server_of(sockets[1])


def test_protocol_arrow_never_dials_the_kserve_socket(tmp_path: Path) -> None:
    path = kserve_node_file(tmp_path, f"{RUN}/kserve-gpu0.sock")
    route = resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())
    assert route.targets == (f"unix://{RUN}/gpu0.sock", "127.0.0.1:7500")


def test_a_kserve_socket_whose_folder_is_missing_is_not_dialled(tmp_path: Path) -> None:
    path = kserve_node_file(tmp_path, str(tmp_path / "gone" / "kserve-gpu0.sock"))
    route = resolve_route(ClientConfig(discovery_file=str(path), protocol="kserve"), {}, TaskPlacement())
    assert route.targets == (f"unix://{RUN}/gpu0.sock", "127.0.0.1:7500")


def test_a_server_with_only_tcp_is_reached_over_tcp(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    write_discovery(path, NodeDiscovery(servers=[ServerEntry(device="cpu", tcp_address="127.0.0.1:7500")]))
    assert resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement()).targets == (
        "127.0.0.1:7500",
    )


def test_the_discovery_file_defaults_to_the_executor_environment(tmp_path: Path) -> None:
    assert discovery_path(ClientConfig(), {DISCOVERY_FILE_ENV: "/x/d.json"}) == Path("/x/d.json")
    assert discovery_path(ClientConfig(), {RUNTIME_DIR_ENV: "/rt"}) == Path("/rt/discovery.json")
    assert discovery_path(ClientConfig(discovery_file="/c.json"), {DISCOVERY_FILE_ENV: "/x"}) == Path(
        "/c.json"
    )


def test_no_address_and_no_discovery_file_names_where_it_looked(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    with pytest.raises(NoServerFound, match=f"{ADDRESS_ENV}.*no discovery file at {missing}"):
        resolve_route(ClientConfig(), {DISCOVERY_FILE_ENV: str(missing)}, TaskPlacement())


def test_a_discovery_file_without_ready_servers_is_no_server(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    write_discovery(path, NodeDiscovery(servers=[gpu_server(0, state="starting")]))
    with pytest.raises(NoServerFound, match=r"no ready server.*'gpu:0': 'starting'"):
        resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())


def test_each_target_from_the_discovery_file_is_known_by_its_servers_pid(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    servers = [dataclasses.replace(gpu_server(0), pid=10), dataclasses.replace(gpu_server(1), pid=11)]
    write_discovery(path, NodeDiscovery(servers=servers))
    route = resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())
    assert [route.server_of(target) for target in route.targets + route.alternates] == [
        "pid 10", "pid 10", "pid 11", "pid 11",
    ]  # fmt: skip


def test_a_configured_address_is_known_by_no_server_identity() -> None:
    route = resolve_route(ClientConfig(address="127.0.0.1:7500"), {}, TaskPlacement())
    assert route.server_of("127.0.0.1:7500") is None


def test_no_ready_server_is_explained_with_why_a_server_failed_its_start(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    problem = "server pid 7 serves no model: model repository /models/m holds no servable model"
    restarting = dataclasses.replace(gpu_server(0, state="restarting"), problem=problem)
    write_discovery(path, NodeDiscovery(servers=[restarting]))
    with pytest.raises(NoServerFound, match=f"'gpu:0': 'restarting: {problem}'"):
        resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())


def test_the_fallback_reads_the_model_repository_from_the_config_first(node_file: Path) -> None:
    config = ClientConfig(discovery_file=str(node_file), model_repository="/mine")
    assert fallback_repository(config, {})[0] == Path("/mine")


def test_the_fallback_reads_the_model_repository_from_the_discovery_file_when_told_to(
    node_file: Path,
) -> None:
    config = ClientConfig(discovery_file=str(node_file), fallback_repository_from_node=True)
    repository, origin = fallback_repository(config, {})
    assert repository == Path("/models")
    assert str(node_file) in origin


def test_the_fallback_takes_no_repository_from_the_discovery_file_by_default(node_file: Path) -> None:
    """The fallback runs the repository's model files inside the job: the job names them."""
    with pytest.raises(
        LookupError, match=r"set ClientConfig\.model_repository .*fallback_repository_from_node"
    ):
        fallback_repository(ClientConfig(discovery_file=str(node_file)), {})


def test_the_fallback_without_a_repository_says_how_to_give_one(tmp_path: Path) -> None:
    config = ClientConfig(discovery_file=str(tmp_path / "none.json"), fallback_repository_from_node=True)
    with pytest.raises(LookupError, match=r"set ClientConfig\.model_repository"):
        fallback_repository(config, {})


def test_the_placement_takes_gpu_addresses_from_the_task_resources() -> None:
    placement = placement_from_resources(7, {"gpu": ["3"], "fpga": ["0"]})
    assert placement == TaskPlacement(partition_id=7, gpu_addresses=("3",))


def test_every_address_of_a_server_is_known_as_that_server_s(node_file: Path) -> None:
    route = resolve_route(ClientConfig(discovery_file=str(node_file)), {}, TaskPlacement(partition_id=1))
    for server in (route.targets, *route.alternate_servers):
        for target in server:
            assert route.addresses_of(target) == server
    assert route.addresses_of("127.0.0.1:1") == ("127.0.0.1:1",)  # no server of the route


def test_a_discovery_file_whose_heartbeat_stopped_is_taken_for_absent(tmp_path: Path) -> None:
    """A node killed whole (supervisor and servers, SIGKILL) leaves its file listing ready servers
    at dead sockets; once it is older than the bound the supervisor wrote in it, no task dials them."""
    path = tmp_path / "d.json"
    written_at = time.time() - 30.0
    stale = NodeDiscovery(
        node="n1", updated_at=written_at, heartbeat_s=2.0, stale_after_s=10.0, servers=[gpu_server(0)]
    )
    write_discovery(path, stale)
    with pytest.raises(
        NoServerFound, match=rf"discovery file {path} is stale: written 3\d\.\d s ago .* older than 10.0 s"
    ):
        resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())


def test_a_discovery_file_within_its_staleness_bound_routes(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    write_discovery(path, NodeDiscovery(heartbeat_s=2.0, stale_after_s=10.0, servers=[gpu_server(0)]))
    route = resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement())
    assert route.targets[0] == f"unix://{RUN}/gpu0.sock"


def test_a_discovery_file_without_a_heartbeat_never_goes_stale(tmp_path: Path) -> None:
    """The file of a supervisor that writes no heartbeat (no stale_after_s) keeps its meaning."""
    path = tmp_path / "d.json"
    write_discovery(path, NodeDiscovery(updated_at=0.0, servers=[gpu_server(0)]))
    assert resolve_route(ClientConfig(discovery_file=str(path)), {}, TaskPlacement()).targets


def test_a_stale_discovery_file_still_names_the_repository_for_the_cpu_fallback(tmp_path: Path) -> None:
    """The model files outlive the servers that died: the fallback still finds them."""
    path = tmp_path / "d.json"
    write_discovery(path, NodeDiscovery(model_repository="/models", updated_at=0.0, stale_after_s=10.0))
    config = ClientConfig(discovery_file=str(path), fallback_repository_from_node=True)
    assert fallback_repository(config, {})[0] == Path("/models")
