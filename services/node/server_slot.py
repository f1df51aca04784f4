"""One device's model server as the node supervisor tracks it across restarts: where it listens
and writes, its state, what it serves, and the entry the discovery file lists for it."""

from __future__ import annotations

import os

from udfserve.discovery import ServerEntry, ServerState
from udfserve.services.model_server.launcher import ServerProcess, serve_arguments
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot
from udfserve.services.node.ready_file import ReadyFileWatch, ServedModels
from udfserve.services.node.server_flags import asks_for_native_kserve


class ServerSlot:
    """One device's server as the supervisor tracks it across restarts."""

    def __init__(self, device: DeviceSlot, position: int, config: NodeConfig) -> None:
        self.device = device
        self.socket_path = config.runtime_dir / f"server-{device.slug}.sock"
        self.kserve_socket_path = (
            config.runtime_dir / f"kserve-{device.slug}.sock"
            if asks_for_native_kserve(config.server_extra_args, os.environ)
            else None
        )
        """The native KServe front end's socket, where ``--server-args`` ask for it; None otherwise."""
        self.ready_file = config.runtime_dir / f"server-{device.slug}.ready.json"
        self.log_path = config.log_dir / f"server-{device.slug}.log"
        base = config.server_port_base
        self.port: int | None = None if base is None else (base + position if base else 0)
        http_base = config.server_http_port_base
        self.http_port = http_base + position if http_base else 0
        self.state: ServerState = "starting"
        self.process: ServerProcess | None = None
        self.served = ServedModels()
        """The models and versions the server serves, as its ready file says (``ready_file.py``)."""
        self.watch: ReadyFileWatch | None = None
        self.problem = ""
        """Why the last start failed (the server's own reason when it serves no model); "" once ready."""

    def server_args(self, config: NodeConfig) -> list[str]:
        """The flags the node gives this server beyond ``launch_server``'s own ones."""
        kserve = [] if self.kserve_socket_path is None else ["--kserve-socket", str(self.kserve_socket_path)]
        return config.server_flags(self.device) + config.server_extra_args + kserve

    def serve_arguments(self, config: NodeConfig) -> list[str]:
        """This server's whole ``udfserve serve`` command line (its lifeline aside)."""
        return serve_arguments(
            config.model_repository,
            device=self.device.device,
            socket=self.socket_path,
            port=self.port,
            http_port=self.http_port,
            ready_file=self.ready_file,
            extra_args=self.server_args(config),
        )

    def entry(self) -> ServerEntry:
        ready = self.state == "ready" and self.process is not None
        return ServerEntry(
            device=self.device.device,
            device_index=self.device.index,
            device_uuid=self.device.uuid,
            unix_socket=str(self.socket_path),
            tcp_address=self.process.tcp_address if ready and self.process else None,
            http_address=self.process.http_address if ready and self.process else None,
            kserve_address=self.process.kserve_address if ready and self.process else None,
            kserve_socket=self.process.kserve_socket if ready and self.process else None,
            kserve_http_address=self.process.kserve_http_address if ready and self.process else None,
            kserve_frontend=self.process.kserve_frontend if ready and self.process else None,
            pid=self.process.pid if self.process is not None else None,
            models=list(self.served.models) if ready else [],
            versions=dict(self.served.versions) if ready else {},
            state=self.state,
            problem=self.problem or None,
        )


def describe_served(served: ServedModels) -> str:
    """``tabular_mlp 1,2, text_hashing 3`` (a model without listed versions by its name alone)."""
    parts = [
        f"{name} {','.join(map(str, served.versions[name]))}" if served.versions.get(name) else name
        for name in served.models
    ]
    return ", ".join(parts) or "no model"
