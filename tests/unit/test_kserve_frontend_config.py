"""--kserve-frontend: auto (the default) picks native where it loads and has a port or a socket; the
python front end shares the main listeners; the native one needs a port, a socket, or both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.frontends.kserve.frontend_choice import choose_kserve_frontend
from udfserve.services.model_server.frontends.kserve.native import (
    BUILD_COMMAND,
    NativeFrontendUnavailable,
    load_frontend_module,
)

NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"


def test_auto_is_the_default_and_no_kserve_port_is_opened_unless_given() -> None:
    config = ServerConfig(model_repository=Path("/m"))
    assert (config.kserve_frontend, config.kserve_port) == ("auto", None)


def test_auto_accepts_a_kserve_port() -> None:
    config = ServerConfig(model_repository=Path("/m"), kserve_port=8001)
    assert (config.kserve_frontend, config.kserve_port) == ("auto", 8001)


def test_the_native_front_end_without_a_port_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValidationError, match=r"give --kserve-port \(0 picks one\)"):
        ServerConfig(model_repository=Path("/m"), kserve_frontend="native")


def test_a_kserve_port_for_the_python_front_end_is_refused_naming_the_choice() -> None:
    with pytest.raises(ValidationError, match="expected --kserve-frontend native or auto with it"):
        ServerConfig(model_repository=Path("/m"), kserve_frontend="python", kserve_port=8001)


def test_the_native_front_end_may_listen_on_a_kserve_socket_alone() -> None:
    config = ServerConfig(
        model_repository=Path("/m"), kserve_frontend="native", kserve_socket=Path("/k.sock")
    )
    assert (config.kserve_port, config.kserve_socket) == (None, Path("/k.sock"))


def test_a_kserve_socket_for_the_python_front_end_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValidationError, match="--kserve-socket is the native front end's"):
        ServerConfig(model_repository=Path("/m"), kserve_frontend="python", kserve_socket=Path("/k.sock"))


def test_a_kserve_socket_at_the_main_socket_path_is_refused() -> None:
    with pytest.raises(ValidationError, match="is --socket too; expected a path of its own"):
        ServerConfig(model_repository=Path("/m"), socket=Path("/s.sock"), kserve_socket=Path("/s.sock"))


def test_a_kserve_socket_needs_no_tls_with_a_non_loopback_host() -> None:
    """It is local, as the main socket: the checks on listeners beyond loopback are the port's."""
    config = ServerConfig(
        model_repository=Path("/m"),
        host="0.0.0.0",
        port=None,
        socket=Path("/s"),
        kserve_frontend="native",
        kserve_socket=Path("/k.sock"),
    )
    assert config.kserve_socket == Path("/k.sock")


def test_an_unknown_front_end_is_refused_listing_the_three() -> None:
    with pytest.raises(ValidationError, match="'auto', 'python' or 'native'"):
        ServerConfig(model_repository=Path("/m"), kserve_frontend="grpcio")


def test_auto_without_a_kserve_port_is_the_python_front_end_and_says_why() -> None:
    choice = choose_kserve_frontend("auto", None)
    assert (choice.frontend, choice.fallback) == ("python", False)
    assert "without --kserve-port" in choice.reason


def test_auto_with_a_socket_alone_is_the_native_front_end_where_its_module_loads() -> None:
    load_frontend_module()
    assert choose_kserve_frontend("auto", None, Path("/k.sock")).frontend == "native"


def test_auto_with_a_socket_falls_back_to_python_naming_the_socket_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, None)
    choice = choose_kserve_frontend("auto", None, Path("/k.sock"))
    assert (choice.frontend, choice.fallback) == ("python", True)
    assert "on --kserve-socket and the main listeners" in choice.reason


def test_auto_with_a_port_is_the_native_front_end_where_its_module_loads() -> None:
    load_frontend_module()  # built in this environment: the suite builds it (scripts/native.sh)
    choice = choose_kserve_frontend("auto", 0)
    assert (choice.frontend, choice.fallback) == ("native", False)
    assert "loads" in choice.reason


def test_auto_with_a_port_falls_back_to_python_naming_the_build_command_where_it_does_not_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, None)  # Python's own "not installed"
    choice = choose_kserve_frontend("auto", 8001)
    assert (choice.frontend, choice.fallback) == ("python", True)
    assert BUILD_COMMAND in choice.reason and "--kserve-port" in choice.reason


@pytest.mark.parametrize("requested", ["python", "native"])
def test_an_explicit_front_end_is_taken_as_given_without_loading_anything(
    requested: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, None)
    choice = choose_kserve_frontend(requested, 8001 if requested == "native" else None)
    assert (choice.frontend, choice.fallback, choice.reason) == (
        requested,
        False,
        f"--kserve-frontend {requested}",
    )


def test_the_native_port_beyond_loopback_needs_tls_like_the_others() -> None:
    with pytest.raises(ValidationError, match="--allow-insecure-remote"):
        ServerConfig(
            model_repository=Path("/m"),
            host="0.0.0.0",
            port=None,
            socket=Path("/s"),
            kserve_frontend="native",
            kserve_port=8001,
        )


def test_an_unbuilt_native_module_is_named_with_its_build_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, None)
    build = r"python -m udfserve\.services\.model_server\.frontends\.kserve\.native\.build"
    with pytest.raises(NativeFrontendUnavailable, match=build):
        load_frontend_module()
