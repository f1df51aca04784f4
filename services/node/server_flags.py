"""The ``udfserve serve`` flags the node sets for each server (``NodeConfig.server_flags``), and
``--server-args`` checked against them.

The node sets some flags of every server itself: from its own settings of the same name and meaning
(``--grace-period-s``, ``--log-level``, ``--log-format``, ``--model-control`` and the other
model-lifecycle settings), or per server (its device, socket, ports, ready file). ``--server-args``
come after them on the server's command line, where the last value given wins: a flag given there
again would run every server otherwise than the node believes (its SIGKILL deadline shorter than a
server's own grace period, every server on one ``--device``, a ``--model-control`` the node's own
setting does not say). So such ``--server-args`` are refused when the node starts, naming the
node's flag to use instead.

Before it starts anything, the node also reads each server's whole command line as ``udfserve
serve`` will (``check_server_command``): a configuration the server refuses (TLS on a
non-loopback host that authenticates no client, a TLS file that is not PEM, an unknown flag)
would make it exit at every start, and the node restart it in a loop; the node refuses to start
instead, with the server's own message.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import NoReturn

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.shared_settings import SHARED_SETTINGS
from udfserve.services.settings_cli import add_settings_arguments, env_name, flag_name, settings_from_args

NODE_SET_FLAGS: Mapping[str, str] = {
    **{name: f"the node's {flag_name(name)}" for name in SHARED_SETTINGS},
    "model_repository": "the node's --model-repository",
    "models": "the node's --models",
    "device": "the node's --devices",
    "device_uuid": "the node's --devices (the uuid comes from NVML)",
    "socket": "the node's --runtime-dir (each server listens on <runtime dir>/server-<device>.sock)",
    "kserve_socket": "the node's --runtime-dir (a server asked for the native KServe front end listens "
    "on <runtime dir>/kserve-<device>.sock too)",
    "ready_file": "the node's --runtime-dir (each server writes <runtime dir>/server-<device>.ready.json)",
    "lifeline_fd": "nothing: the supervisor hands each server its lifeline",
    "host": "the node's --server-host",
    "port": "the node's --server-port-base",
    "http_host": "the node's --server-http-host",
    "http_port": "the node's --server-http-port-base",
    "allow_insecure_remote": "the node's --allow-insecure-remote",
}
"""Each server setting the node sets itself, and what to use instead of giving it in --server-args."""


class _ServeFlags(argparse.ArgumentParser):
    """The flags of ``udfserve serve``, read as the server reads them (abbreviations included)."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def check_server_args(words: Sequence[str]) -> None:
    """Refuse ``--server-args`` that give a flag the node sets itself (ValueError naming each one
    and what to use instead). Flags the server does not know are left to the server."""
    parser = _ServeFlags(prog="udfserve serve", add_help=False)
    add_settings_arguments(parser, ServerConfig)
    try:
        given, _ = parser.parse_known_args(list(words))
    except (ValueError, argparse.ArgumentError) as exc:
        raise ValueError(
            f"--server-args {' '.join(words)!r} are not flags of `udfserve serve`: {exc}"
        ) from None
    repeated = [name for name in NODE_SET_FLAGS if getattr(given, name) is not None]
    if repeated:
        problems = "; ".join(
            f"{flag_name(name)} (use {NODE_SET_FLAGS[name]}"
            + (f" or {env_name(ServerConfig, name)}" if name in SHARED_SETTINGS else "")
            + ")"
            for name in repeated
        )
        raise ValueError(
            f"--server-args give flags that the node sets for every server itself: {problems}; "
            "expected only flags the node does not set (e.g. --inference-threads 2)"
        )


def asks_for_native_kserve(words: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether servers run with ``--server-args`` ``words`` (and the node's ``environ``, which they
    inherit) ask for the native KServe front end: ``--kserve-frontend native``, or ``auto`` with a
    ``--kserve-port``, as the shipped configurations give. Such a server gets a KServe socket in the
    runtime folder, where executors in other containers reach it; without that ask, ``auto`` stays
    the python front end on the main listeners, as a node's servers always ran."""
    parser = _ServeFlags(prog="udfserve serve", add_help=False)
    add_settings_arguments(parser, ServerConfig)
    given, _ = parser.parse_known_args(list(words))

    def setting(name: str, default: str) -> str:
        value = getattr(given, name)
        return str(value) if value is not None else environ.get(env_name(ServerConfig, name), default)

    frontend = setting("kserve_frontend", "auto").strip().lower()
    port = setting("kserve_port", "off").strip().lower()
    return frontend == "native" or (frontend == "auto" and port not in {"off", "none", ""})


def check_server_command(arguments: Sequence[str]) -> ServerConfig:
    """Read a server's ``udfserve serve`` flags as the server does, with its own settings class
    and the environment it inherits, and its token and TLS files as it reads them at start; the
    server's settings, or a ValueError with the server's own message."""
    parser = _ServeFlags(prog="udfserve serve", add_help=False)
    add_settings_arguments(parser, ServerConfig)
    given = parser.parse_args(list(arguments))  # a flag serve does not have: ValueError
    config = settings_from_args(ServerConfig, given)
    from udfserve.services.model_server.security import check_credentials  # grpc and FastAPI: only here

    check_credentials(config)
    return config
