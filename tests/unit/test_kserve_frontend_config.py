"""--kserve-frontend: the python front end shares the main listeners; the native one needs a port."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.frontends.kserve.native import (
    NativeFrontendUnavailable,
    load_frontend_module,
)


def test_the_python_front_end_is_the_default_and_has_no_port_of_its_own() -> None:
    config = ServerConfig(model_repository=Path("/m"))
    assert (config.kserve_frontend, config.kserve_port) == ("python", None)


def test_the_native_front_end_without_a_port_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValidationError, match=r"give --kserve-port \(0 picks one\)"):
        ServerConfig(model_repository=Path("/m"), kserve_frontend="native")


def test_a_kserve_port_for_the_python_front_end_is_refused_naming_the_choice() -> None:
    with pytest.raises(ValidationError, match="expected --kserve-frontend native with it"):
        ServerConfig(model_repository=Path("/m"), kserve_port=8001)


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
    monkeypatch.setitem(
        sys.modules, "udfserve.services.model_server.frontends.kserve.native._kserve_frontend", None
    )
    build = r"python -m udfserve\.services\.model_server\.frontends\.kserve\.native\.build"
    with pytest.raises(NativeFrontendUnavailable, match=build):
        load_frontend_module()
