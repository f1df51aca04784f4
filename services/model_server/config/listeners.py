"""Settings of where a server runs and where clients reach it: its device, the unix sockets, the
gRPC, KServe and HTTP ports, the ready file, and the shared-memory folder of clients on the socket.

``is_loopback`` decides which addresses count as this machine only; the checks that need the
security settings as well (plaintext or unauthenticated listeners beyond loopback) are the
composed ``ServerConfig``'s.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from udfserve.runtime.device import DEVICE_PATTERN
from udfserve.shared_memory import DEFAULT_DIRECTORY as DEFAULT_SHARED_MEMORY_DIRECTORY


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: localhost, 127.0.0.0/8, ::1."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def off_as_none(value: object) -> object:
    """``off``, ``none`` or an empty value as None: the setting is turned off."""
    if isinstance(value, str) and value.strip().lower() in {"off", "none", ""}:
        return None
    return value


class ListenerSettings(BaseModel):
    """The device the process is pinned to, and every listener it opens."""

    device: str = Field(
        default="cpu",
        description='"cpu", "gpu:N" or "sim:N" (a CPU process labelled as device N); pinned to it',
    )
    device_uuid: str | None = Field(default=None, description="NVML uuid of the device, for metrics labels")
    socket: Path | None = Field(default=None, description="unix socket path for gRPC (none if unset)")
    socket_mode: str = Field(
        default="0600", pattern=r"^0?[0-7]{3}$", description="permissions of the unix socket (octal)"
    )
    host: str = Field(default="127.0.0.1", description="TCP host for gRPC")
    port: int | None = Field(
        default=7500, ge=0, le=65535, description="TCP port for gRPC; 0 picks a free one, off disables TCP"
    )
    kserve_frontend: Literal["auto", "python", "native"] = Field(
        default="auto",
        description="front end of the KServe v2 protocol: auto (native where the compiled module loads "
        "and --kserve-port is given, else python, saying why in the start-up log; a fallback to python "
        "listens on --kserve-port too), python (grpc.aio, on the main gRPC port and socket, beside the "
        "Arrow service) or native (grpc++, built by `python -m "
        "udfserve.services.model_server.frontends.kserve.native.build`, on --kserve-port of --host; "
        "much less CPU per request)",
    )
    kserve_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="TCP port of --host for the native KServe front end (--kserve-frontend native, or auto "
        "where it loads; auto's python fallback listens there too); 0 picks a free one",
    )
    kserve_socket: Path | None = Field(
        default=None,
        description="unix socket path of the native KServe front end (--kserve-frontend native, or auto "
        "where it loads; auto's python fallback listens there too), beside --kserve-port or instead of it: "
        "local, so plaintext, with --socket's mode and stale-socket rules; the token is required on it as "
        "on the port",
    )
    kserve_http_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="TCP port of --host serving the KServe v2 protocol over HTTP/REST (Triton's /v2 routes, "
        "JSON and binary tensors); 0 picks a free one; off (the default) serves none",
    )
    kserve_http_loop: Literal["own", "serving"] = Field(
        default="own",
        description="where the KServe HTTP port runs: own (a thread and event loop of its own, as the "
        "admin app: a flood of HTTP requests leaves the gRPC predictions 1.5 to 4 times the rate it does "
        "on the serving loop) or serving (on the event loop that serves gRPC: more HTTP requests a second "
        "under load, at the gRPC predictions' expense)",
    )
    http_host: str = Field(default="127.0.0.1", description="host of the HTTP admin app")
    http_port: int | None = Field(
        default=7501, ge=0, le=65535, description="HTTP admin port; 0 picks a free one, off disables HTTP"
    )
    ready_file: Path | None = Field(
        default=None,
        description="write the bound addresses here as JSON once listening, and again with the "
        "loaded models (or, when none serves, why: not_serving) once loading has finished",
    )

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE_PATTERN.match(value):
            raise ValueError(f'invalid device {value!r}; expected "cpu", "gpu:N" or "sim:N" (e.g. gpu:0)')
        return value

    @field_validator("port", "http_port", "kserve_port", "kserve_http_port", mode="before")
    @classmethod
    def _port_off(cls, value: object) -> object:
        return off_as_none(value)

    @model_validator(mode="after")
    def _some_listener(self) -> ListenerSettings:
        if self.socket is None and self.port is None:
            raise ValueError("nothing to listen on: give a unix socket, a TCP port, or both")
        return self

    @model_validator(mode="after")
    def _kserve_listener(self) -> ListenerSettings:
        if self.kserve_frontend == "native" and self.kserve_port is None and self.kserve_socket is None:
            raise ValueError(
                "--kserve-frontend native listens on its own port or socket: give --kserve-port (0 picks "
                "one), --kserve-socket PATH, or both"
            )
        if self.kserve_frontend == "python":
            for flag, value in (("--kserve-port", self.kserve_port), ("--kserve-socket", self.kserve_socket)):
                if value is not None:
                    raise ValueError(
                        f"{flag} is the native front end's; expected --kserve-frontend native or auto "
                        "with it (the python front end serves KServe on --port and --socket)"
                    )
        if self.kserve_socket is not None and self.kserve_socket == self.socket:
            raise ValueError(
                f"--kserve-socket {self.kserve_socket} is --socket too; expected a path of its own "
                "(the main socket serves the Arrow service and the python KServe front end)"
            )
        return self


class SharedMemorySettings(BaseModel):
    """The tmpfs folder where clients on the unix socket may put payloads, and whose files are read."""

    shared_memory_dir: Path | None = Field(
        default=Path(DEFAULT_SHARED_MEMORY_DIRECTORY),
        description="tmpfs folder where clients on the unix socket may put payloads (udfserve-*.shm "
        "files of the server's user, or of --shared-memory-uids); 'off' disables shared memory",
    )
    shared_memory_uids: Annotated[tuple[int, ...], NoDecode] = Field(
        default=(),
        description="other users (uids, comma-separated) whose shared-memory files this server reads, "
        "such as 185 for executors of the apache/spark images; their files must give this server's "
        "group read and write (the client's shared_memory_group_access)",
    )
    shared_memory_max_request_bytes: int = Field(
        default=256 << 20,
        ge=1 << 16,
        le=1 << 40,
        description="largest request a client may name in shared memory: the server copies each "
        "request out of the client's file into its own memory, and refuses a larger one with "
        "INVALID_ARGUMENT before copying",
    )
    kserve_shared_memory_max_regions: int = Field(
        default=256,
        ge=1,
        le=1 << 16,
        description="KServe system shared-memory regions registered at once on the server; one more "
        "is refused RESOURCE_EXHAUSTED (each holds a file descriptor)",
    )
    kserve_shared_memory_max_bytes: int = Field(
        default=64 << 30,
        ge=1,
        description="total size of the KServe system shared-memory regions registered at once on the server",
    )
    kserve_shared_memory_max_regions_per_client: int = Field(
        default=64,
        ge=1,
        le=1 << 16,
        description="KServe system shared-memory regions one client (a peer address, without its port) "
        "may hold registered at once",
    )
    kserve_shared_memory_max_bytes_per_client: int = Field(
        default=16 << 30,
        ge=1,
        description="total size of the KServe system shared-memory regions one client may hold registered",
    )

    @field_validator("shared_memory_uids", mode="before")
    @classmethod
    def _split_uids(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        uids = []
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            if not item.isdigit():
                raise ValueError(
                    f"expected numeric uids separated by commas, such as '185,1000'; received {value!r}"
                )
            uids.append(int(item))
        return tuple(uids)

    @field_validator("shared_memory_dir", mode="before")
    @classmethod
    def _folder_off(cls, value: object) -> object:
        return off_as_none(value)

    @field_validator("shared_memory_dir")
    @classmethod
    def _absolute_folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"expected an absolute folder path or 'off', received {str(value)!r}")
        return value
