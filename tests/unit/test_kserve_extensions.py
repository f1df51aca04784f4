"""The extensions a server lists in its metadata: exactly those it serves, the same on both protocols."""

from __future__ import annotations

from udfserve.services.model_server.frontends.kserve.metadata import server_extensions


def test_without_the_http_port_the_extensions_are_those_both_protocols_serve() -> None:
    assert server_extensions(http=False) == ("model_configuration", "model_repository", "statistics")


def test_system_shared_memory_is_listed_where_it_is_served() -> None:
    assert server_extensions(http=False, system_shared_memory=True) == (
        "model_configuration",
        "model_repository",
        "statistics",
        "system_shared_memory",
    )


def test_with_the_http_port_binary_tensor_data_is_listed_too() -> None:
    assert server_extensions(http=True) == (
        "binary_tensor_data",
        "model_configuration",
        "model_repository",
        "statistics",
    )
