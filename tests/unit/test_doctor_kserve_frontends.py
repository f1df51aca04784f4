"""The doctor's line on the native KServe front end: what the node's servers serve KServe with, and
why, read from the discovery file's ``kserve_frontend``, ``kserve_address`` and ``kserve_socket``."""

from __future__ import annotations

from udfserve.discovery import NodeDiscovery, ServerEntry
from udfserve.services.doctor.kserve_frontends import native_finding
from udfserve.services.model_server.frontends.kserve.native import BUILD_COMMAND


def node(*servers: ServerEntry) -> NodeDiscovery:
    return NodeDiscovery(node="n1", servers=list(servers))


def server(device: str, frontend: str | None, address: str | None) -> ServerEntry:
    return ServerEntry(device=device, kserve_frontend=frontend, kserve_address=address)


def test_servers_serving_with_the_native_front_end_are_named_and_it_passes() -> None:
    finding = native_finding(True, "", True, node(server("gpu:0", "native", "127.0.0.1:8001")))
    assert finding.status == "ok"
    assert "built here, and it loads; the node's gpu:0 serves KServe with it" in finding.summary
    assert finding.facts["servers_using_it"] == ["gpu:0"]


def test_a_server_that_fell_back_on_its_kserve_port_warns_with_the_build_command() -> None:
    finding = native_finding(False, "not built here", True, node(server("cpu", "python", "127.0.0.1:8001")))
    assert finding.status == "warn"
    assert "found no native module where the server runs" in finding.summary
    assert BUILD_COMMAND in finding.fix and finding.facts["servers_fallen_back"] == ["cpu"]


def test_a_server_without_a_kserve_port_is_told_how_auto_would_pick_native() -> None:
    finding = native_finding(True, "", True, node(server("cpu", "python", None)))
    assert finding.status == "ok"
    assert "no --kserve-port" in finding.summary and "--server-args='--kserve-port 0'" in finding.summary


def test_an_older_nodes_kserve_address_is_taken_for_the_native_front_end() -> None:
    finding = native_finding(True, "", False, node(server("gpu:1", None, "127.0.0.1:8002")))
    assert finding.facts["servers_using_it"] == ["gpu:1"]
    assert finding.summary.startswith("built here; ")


def test_without_a_node_it_says_what_servers_started_here_would_serve_with() -> None:
    assert (
        "serve KServe with the python front end"
        in native_finding(False, "not built here", True, None).summary
    )
    assert "--kserve-frontend auto, the default" in native_finding(True, "", True, None).summary


def test_several_servers_are_named_together() -> None:
    finding = native_finding(
        True,
        "",
        True,
        node(server("gpu:0", "native", "127.0.0.1:1"), server("gpu:1", "native", "127.0.0.1:2")),
    )
    assert "the node's gpu:0, gpu:1 serve KServe with it" in finding.summary


def test_a_native_server_on_its_kserve_socket_alone_is_named_as_serving_with_it() -> None:
    entry = ServerEntry(
        device="gpu:0", kserve_frontend="native", kserve_socket="/run/udfserve/kserve-gpu0.sock"
    )
    finding = native_finding(True, "", True, node(entry))
    assert finding.status == "ok" and finding.facts["servers_using_it"] == ["gpu:0"]
    assert "serves KServe with it, on its KServe port or socket" in finding.summary


def test_a_server_that_fell_back_on_its_kserve_socket_alone_warns() -> None:
    entry = ServerEntry(device="cpu", kserve_frontend="python", kserve_socket="/run/udfserve/kserve-cpu.sock")
    finding = native_finding(False, "not built here", True, node(entry))
    assert finding.status == "warn" and finding.facts["servers_fallen_back"] == ["cpu"]
