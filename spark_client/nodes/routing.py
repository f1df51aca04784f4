"""Which model server a task talks to.

In order: the UDF's own ``address``; the Spark conf ``spark.udfserve.address`` (read in the
driver when the UDF is built, see ``apply_spark_conf``); the executor's ``UDFSERVE_ADDRESS``
variable (read at task time); the node's discovery file, unless its supervisor's heartbeat
stopped (``read_live_discovery``: a file older than its ``stale_after_s`` is taken for absent,
so the servers of a node killed whole are not dialled). From the discovery file, a task to
which Spark assigned GPUs takes the server of its first GPU; any other task takes the ready
servers in device order, round-robin by partition id. The unix socket is dialled before the
TCP port (the TCP port is dialled when the socket cannot be connected to). The node's other ready
servers follow as alternates, for when the chosen one fails. Each target found in the file
carries the identity of its process (``Route.server_of``), for the circuit breakers.

Everything here is a pure function of the config, the environment mapping and the task's
placement, so it is tested without Spark and nothing leaks from one task into the next.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from udfserve.discovery import (
    TRUST_FIX,
    DiscoveryError,
    NodeDiscovery,
    ServerEntry,
    UntrustedDiscoveryFile,
    default_discovery_path,
    read_discovery,
    read_live_discovery,
)
from udfserve.node_files import SocketMissing, UntrustedNodeFile, check_node_socket, trusted_uids
from udfserve.spark_client.common.task_config import TaskConfig, check_target

if TYPE_CHECKING:  # the driver's type: a task imports no pydantic
    from udfserve.spark_client.common.config import ClientConfig

logger = logging.getLogger(__name__)

ADDRESS_ENV = "UDFSERVE_ADDRESS"
SPARK_CONF_ADDRESS = "spark.udfserve.address"
SPARK_CONF_PROTOCOL = "spark.udfserve.protocol"
SPARK_CONF_DISCOVERY_FILE = "spark.udfserve.discoveryFile"
SPARK_CONF_MODEL_REPOSITORY = "spark.udfserve.modelRepository"
SPARK_CONF_AUTH_TOKEN = "spark.udfserve.authToken"
SPARK_CONF_AUTH_TOKEN_FILE = "spark.udfserve.authTokenFile"
SPARK_CONF_TLS_ROOT_CERTIFICATES_FILE = "spark.udfserve.tlsRootCertificatesFile"
SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE = "spark.udfserve.tlsClientCertificateFile"
SPARK_CONF_TLS_CLIENT_KEY_FILE = "spark.udfserve.tlsClientKeyFile"
SPARK_CONF_TLS_SERVER_NAME = "spark.udfserve.tlsServerName"
SPARK_CONF_SHARED_MEMORY = "spark.udfserve.sharedMemory"
SPARK_CONF_SHARED_MEMORY_DIR = "spark.udfserve.sharedMemoryDir"
SPARK_CONF_SHARED_MEMORY_GROUP_ACCESS = "spark.udfserve.sharedMemoryGroupAccess"
SPARK_CONF_TRUSTED_NODE_UIDS = "spark.udfserve.trustedNodeUids"
SPARK_CONF_PRIORITY_CLASS = "spark.udfserve.priorityClass"
SPARK_CONF_VERSION_CONSISTENCY = "spark.udfserve.versionConsistency"
SPARK_CONF_WHEN_PINNED_VERSION_GONE = "spark.udfserve.whenPinnedVersionGone"
SPARK_CONF_FALLBACK_REPOSITORY_FROM_NODE = "spark.udfserve.fallbackRepositoryFromNode"
SPARK_CONF_NODE_START = "spark.udfserve.nodeStart"

_SPARK_CONF_PATHS = {
    SPARK_CONF_DISCOVERY_FILE: "discovery_file",
    SPARK_CONF_MODEL_REPOSITORY: "model_repository",
    SPARK_CONF_AUTH_TOKEN_FILE: "auth_token_file",
    SPARK_CONF_TLS_ROOT_CERTIFICATES_FILE: "tls_root_certificates_file",
    SPARK_CONF_TLS_CLIENT_CERTIFICATE_FILE: "tls_client_certificate_file",
    SPARK_CONF_TLS_CLIENT_KEY_FILE: "tls_client_key_file",
    SPARK_CONF_TLS_SERVER_NAME: "tls_server_name",
}
_SPARK_CONF_SETTINGS = {
    SPARK_CONF_PROTOCOL: "protocol",
    SPARK_CONF_SHARED_MEMORY: "shared_memory",
    SPARK_CONF_SHARED_MEMORY_DIR: "shared_memory_dir",
    SPARK_CONF_SHARED_MEMORY_GROUP_ACCESS: "shared_memory_group_access",
    SPARK_CONF_TRUSTED_NODE_UIDS: "trusted_node_uids",
    SPARK_CONF_PRIORITY_CLASS: "priority_class",
    SPARK_CONF_VERSION_CONSISTENCY: "version_consistency",
    SPARK_CONF_WHEN_PINNED_VERSION_GONE: "when_pinned_version_gone",
    SPARK_CONF_FALLBACK_REPOSITORY_FROM_NODE: "fallback_repository_from_node",
    SPARK_CONF_NODE_START: "node_start",
}
"""Settings with a default of their own: the conf applies unless the UDF's config set them."""
SPARK_CONF_KEYS = (SPARK_CONF_ADDRESS, SPARK_CONF_AUTH_TOKEN, *_SPARK_CONF_SETTINGS, *_SPARK_CONF_PATHS)
"""Every Spark conf key the driver reads when a UDF is built."""


class NoServerFound(LookupError):
    """Nothing names a server for this task; the message says where the client looked, ``kind``
    the short label the client's counters give it."""

    def __init__(self, message: str, kind: str = "no_server") -> None:
        super().__init__(message)
        self.kind = kind


UNTRUSTED = "untrusted_node_file"
"""The label of a route refused because another user could have written the node's files."""


@dataclass(frozen=True)
class TaskPlacement:
    """What Spark tells a task about where it runs."""

    partition_id: int = 0
    gpu_addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    """The gRPC targets of one server, in the order to dial them, and how they were found.

    ``alternate_servers`` are the targets of the node's other ready servers, one tuple per
    server, to try when this one fails. ``servers`` names the process behind each target found
    in the discovery file (its pid there), so that a circuit opened by a process that has since
    been restarted does not hold back its successor.
    """

    targets: tuple[str, ...]
    origin: str
    alternate_servers: tuple[tuple[str, ...], ...] = ()
    servers: tuple[tuple[str, str], ...] = ()

    def server_of(self, target: str) -> str | None:
        """The identity of the process behind ``target`` (None when the discovery file gives none)."""
        return dict(self.servers).get(target)

    @property
    def alternates(self) -> tuple[str, ...]:
        """The other servers' targets, in the order to dial them."""
        return tuple(target for server in self.alternate_servers for target in server)

    def addresses_of(self, target: str) -> tuple[str, ...]:
        """Every target of the server ``target`` belongs to: a server that failed on one of its
        addresses is not tried again through another."""
        for server in (self.targets, *self.alternate_servers):
            if target in server:
                return server
        return (target,)


def apply_spark_conf(config: ClientConfig, conf: Mapping[str, str]) -> ClientConfig:
    """Fill what the config leaves open from the Spark conf, in the driver, once.

    The explicit config wins; the conf's values are frozen into the config that ships with the UDF.
    A token file or a token in the UDF's config beats both token keys of the conf.
    """
    from udfserve.spark_client.common.config import with_conf_values  # the driver's: pydantic

    update: dict[str, object] = {}
    used: list[str] = []
    if config.address is None and conf.get(SPARK_CONF_ADDRESS):
        update["address"] = check_target(conf[SPARK_CONF_ADDRESS], SPARK_CONF_ADDRESS)
        used.append(SPARK_CONF_ADDRESS)
    for key, field in _SPARK_CONF_SETTINGS.items():
        if field not in config.model_fields_set and conf.get(key):
            update[field] = conf[key].strip()
            used.append(key)
    has_token = config.auth_token is not None or config.auth_token_file is not None
    for key, field in _SPARK_CONF_PATHS.items():
        if field == "auth_token_file" and has_token:
            continue
        if getattr(config, field) is None and conf.get(key):
            update[field] = conf[key]
            used.append(key)
    if not has_token and "auth_token_file" not in update and conf.get(SPARK_CONF_AUTH_TOKEN):
        update["auth_token"] = conf[SPARK_CONF_AUTH_TOKEN]
        used.append(SPARK_CONF_AUTH_TOKEN)
    return with_conf_values(config, update, used)


def discovery_path(config: TaskConfig, environ: Mapping[str, str]) -> Path:
    """The discovery file of this node: the config's, else the environment's default."""
    if config.discovery_file:
        return Path(config.discovery_file)
    return default_discovery_path(environ)


def resolve_route(config: TaskConfig, environ: Mapping[str, str], placement: TaskPlacement) -> Route:
    """The server this task should call; raises ``NoServerFound`` saying where it looked."""
    if config.address:
        return Route(targets=(config.address,), origin="the configured address")
    if environ.get(ADDRESS_ENV):
        target = check_target(environ[ADDRESS_ENV], f"environment variable {ADDRESS_ENV}")
        return Route(targets=(target,), origin=f"environment variable {ADDRESS_ENV}")
    path = discovery_path(config, environ)
    trusted = trusted_uids(config.trusted_node_uids)
    try:
        discovery = read_live_discovery(path, trusted=trusted)
    except DiscoveryError as exc:
        raise NoServerFound(
            f"no address configured (ClientConfig.address, {SPARK_CONF_ADDRESS}, {ADDRESS_ENV}) and {exc}",
            UNTRUSTED if isinstance(exc, UntrustedDiscoveryFile) else "no_server",
        ) from exc
    server = choose_server(discovery, placement, path)
    refused: list[str] = []
    kserve = config.protocol == "kserve"
    targets = trusted_targets(server, config.prefer_unix_socket, trusted, refused, kserve)
    if not targets:
        if refused:
            raise NoServerFound(f"discovery file {path}, server {server.device}: {refused[0]}", UNTRUSTED)
        raise NoServerFound(
            f"discovery file {path}: server {server.device} lists no unix socket or TCP address"
        )
    ready = sorted(discovery.ready_servers(), key=_device_order)
    after = ready.index(server) + 1
    alternate_servers = tuple(
        trusted_targets(other, config.prefer_unix_socket, trusted, refused, kserve)
        for other in ready[after:] + ready[: after - 1]
    )
    for problem in refused:
        logger.warning("udfserve: not dialling a socket of discovery file %s: %s", path, problem)
    return Route(
        targets=targets,
        origin=f"discovery file {path}, server {server.device}",
        alternate_servers=tuple(server for server in alternate_servers if server),
        servers=tuple(
            (target, f"pid {entry.pid}")
            for entry in ready
            if entry.pid is not None
            for target in ordered_targets(entry, True, kserve)
        ),
    )


def discovery_stamp(config: TaskConfig, environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """What changes whenever the node rewrites its discovery file (file, time, size); None when
    the route does not come from the file, or there is none. Cheap enough to ask at every batch."""
    if config.address or environ.get(ADDRESS_ENV):
        return None
    try:
        found = discovery_path(config, environ).stat()
    except OSError:
        return None
    return (found.st_ino, found.st_mtime_ns, found.st_size)


def choose_server(discovery: NodeDiscovery, placement: TaskPlacement, path: Path | str) -> ServerEntry:
    """The server of the task's first GPU, else round-robin by partition over the ready servers."""
    ready = sorted(discovery.ready_servers(), key=_device_order)
    if not ready:
        states = {s.device: f"{s.state}: {s.problem}" if s.problem else s.state for s in discovery.servers}
        raise NoServerFound(f"discovery file {path} lists no ready server (servers and states: {states})")
    if placement.gpu_addresses:
        wanted = placement.gpu_addresses[0]
        for server in ready:
            if server.device_index is not None and str(server.device_index) == wanted.strip():
                return server
        logger.warning(
            "Spark assigned GPU %s to partition %d but discovery file %s lists no ready server for it "
            "(ready: %s); choosing round-robin instead",
            wanted,
            placement.partition_id,
            path,
            [s.device for s in ready],
        )
    return ready[placement.partition_id % len(ready)]


def ordered_targets(server: ServerEntry, prefer_unix_socket: bool, kserve: bool = False) -> tuple[str, ...]:
    """The server's targets in the order to dial them: its unix sockets first unless told otherwise.
    For ``kserve`` (``protocol="kserve"``) the KServe socket the node published (``kserve_socket``:
    the native front end, much less server CPU per call) comes before the main socket, which serves
    KServe with the python front end."""
    sockets = [f"unix://{server.kserve_socket}"] if kserve and server.kserve_socket else []
    sockets += [f"unix://{server.unix_socket}"] if server.unix_socket else []
    tcp = [server.tcp_address] if server.tcp_address else []
    return tuple(sockets + tcp if prefer_unix_socket else tcp + sockets)


def trusted_targets(
    server: ServerEntry,
    prefer_unix_socket: bool,
    trusted: frozenset[int],
    refused: list[str],
    kserve: bool = False,
) -> tuple[str, ...]:
    """``ordered_targets`` less a unix socket that another user created or could replace (its
    problem appended to ``refused``): the rows sent there would go to that user's process. A socket
    missing from a trusted folder stays (nobody else can create it there: dialling it fails
    plainly, as for a server that is restarting); one whose folder is missing goes."""
    dropped: dict[str, Any] = {}
    for field, what in (("unix_socket", "socket"), ("kserve_socket", "KServe socket")):
        path = getattr(server, field)
        if not path or (field == "kserve_socket" and not kserve):
            continue
        try:
            check_node_socket(Path(path), trusted, f"the {what} of server {server.device}", TRUST_FIX)
        except UntrustedNodeFile as exc:
            refused.append(str(exc))
            dropped[field] = None
        except SocketMissing:
            pass  # kept: in a trusted folder only its owner can create it (a server restarting)
        except FileNotFoundError:
            dropped[field] = None
    return ordered_targets(
        dataclasses.replace(server, **dropped) if dropped else server, prefer_unix_socket, kserve
    )


def fallback_repository(config: TaskConfig, environ: Mapping[str, str]) -> tuple[Path, str]:
    """Where the CPU fallback loads the model from, and how that was decided.

    The config's (or the Spark conf's) ``model_repository``; else, only with
    ``fallback_repository_from_node``, the repository the node's servers load, as its discovery
    file says (a stale file still names it: the files outlive the servers that died). The
    fallback runs those model files inside the job, as the job's user: a repository is taken
    from the node's file only when the job says so, and only from a file that passes the
    ownership checks. Raises ``LookupError`` saying what to set.
    """
    if config.model_repository:
        return Path(config.model_repository), "the configured model_repository"
    if not config.fallback_repository_from_node:
        raise LookupError(FALLBACK_NEEDS_FILES)
    path = discovery_path(config, environ)
    try:
        discovery = read_discovery(path, trusted_uids(config.trusted_node_uids))
    except DiscoveryError as exc:
        raise LookupError(
            "the CPU fallback needs the model files: fallback_repository_from_node takes the repository "
            f"the node's discovery file names, but {exc}; or set ClientConfig.model_repository (or "
            f"{SPARK_CONF_MODEL_REPOSITORY})"
        ) from exc
    if not discovery.model_repository:
        raise LookupError(
            f"the CPU fallback needs the model files: discovery file {path} names no model_repository; "
            "set ClientConfig.model_repository"
        )
    return Path(discovery.model_repository), f"discovery file {path}"


FALLBACK_NEEDS_FILES = (
    "the CPU fallback needs the model files: set ClientConfig.model_repository (or "
    f"{SPARK_CONF_MODEL_REPOSITORY}); the repository a node's discovery file names is used only with "
    f"fallback_repository_from_node=True ({SPARK_CONF_FALLBACK_REPOSITORY_FROM_NODE})"
)


def fallback_problem(exc: LookupError, already_said: str) -> str:
    """What ``fallback_repository``'s error adds to ``already_said``: without the discovery
    file's problem when that text states it already (a task that found no server for want of
    the file is told so once)."""
    if isinstance(exc.__cause__, DiscoveryError) and str(exc.__cause__) in already_said:
        return FALLBACK_NEEDS_FILES
    return str(exc)


def _device_order(server: ServerEntry) -> tuple[int, int, str]:
    index = server.device_index if server.device_index is not None else -1
    return (0 if server.device == "cpu" else 1, index, server.device)


def placement_from_resources(partition_id: int, resources: Mapping[str, Sequence[str]]) -> TaskPlacement:
    """A placement from the plain parts of Spark's ``TaskContext`` (partition id, resource addresses)."""
    return TaskPlacement(partition_id=partition_id, gpu_addresses=tuple(resources.get("gpu", ())))
