"""Each server of the discovery file: its state, its unix socket, its health, what it serves.

The socket is judged as the client judges it before dialling (``check_node_socket``: created by
a trusted user, in a folder nobody else can write), then connected to as this user: a socket's
own mode decides who may connect, and a client that cannot falls back to the server's TCP port,
losing shared memory, or, with no TCP port, to the CPU. Health is the standard gRPC health
check (open without a token); the models and versions come from the server's repository index,
asked with the token the jobs here would send, so the answer also says whether that token is
accepted (``token_checks``).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from udfserve.discovery import TRUST_FIX, NodeDiscovery, ServerEntry
from udfserve.node_files import SocketMissing, UntrustedNodeFile, check_node_socket, describe_uid
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.doctor.report import Finding, Status
from udfserve.spark_client.wire.credentials import CallMetadata

NOT_A_FAILURE = frozenset({"unloaded"})
"""Index reasons that say a model is simply not loaded (not in --models), not that it failed."""


@dataclass
class ServerAnswers:
    """What one ready server answered: where, its health, its index (or the call's error)."""

    entry: ServerEntry
    target: str | None = None
    socket_reachable: bool = False
    health: str = ""
    health_error: str = ""
    index: list[pb.RepositoryIndexResponse.Entry] | None = None
    index_code: grpc.StatusCode | None = None
    index_error: str = ""
    serving: dict[str, list[int]] = field(default_factory=dict)
    leased: dict[str, list[int]] = field(default_factory=dict)
    """Versions the policy no longer serves, kept for the jobs that pinned them (``--version-lease-s``)."""
    requires_token: bool | None = None
    """Whether the server refused the index without a token (None: not asked without one)."""

    def index_error_text(self) -> str:
        code = f"{self.index_code.name}: " if self.index_code is not None else ""
        return f"{code}{self.index_error}"


def check_servers(
    discovery: NodeDiscovery,
    runtime_dir: Path,
    trusted: frozenset[int],
    metadata: CallMetadata,
    timeout_s: float,
) -> tuple[list[Finding], list[ServerAnswers]]:
    """Findings of the servers and sockets groups, and each ready server's answers."""
    findings: list[Finding] = []
    answers: list[ServerAnswers] = []
    if not discovery.servers:
        findings.append(
            Finding(
                group="servers",
                name="servers",
                status="fail",
                summary="the discovery file lists no server: the node plans none (its log says why)",
                fix="look at the supervisor's log; `udfserve node --devices cpu` serves on the CPU",
            )
        )
    for entry in discovery.servers:
        if entry.state != "ready":
            findings.append(_not_ready(entry, runtime_dir))
            continue
        reached = ServerAnswers(entry)
        if entry.unix_socket:
            socket_finding, reached.socket_reachable = _socket(entry, trusted, timeout_s)
            findings.append(socket_finding)
        targets = ([f"unix://{entry.unix_socket}"] if reached.socket_reachable else []) + (
            [entry.tcp_address] if entry.tcp_address else []
        )
        _ask(reached, targets, metadata, timeout_s)
        findings.extend(_server_findings(reached, runtime_dir))
        answers.append(reached)
    findings.extend(_versions_agree(answers))
    return findings, answers


def _not_ready(entry: ServerEntry, runtime_dir: Path) -> Finding:
    problem = f": {entry.problem}" if entry.problem else ""
    return Finding(
        group="servers",
        name=entry.device,
        status="fail",
        summary=f"{entry.state}{problem}. Jobs whose tasks this server would take send their rows to the "
        "node's other servers, else to the CPU fallback",
        fix=f"its log: {_server_log(entry, runtime_dir)}; the supervisor restarts it with back-off",
        facts={"state": entry.state, "problem": entry.problem, "pid": entry.pid},
    )


def _server_log(entry: ServerEntry, runtime_dir: Path) -> Path:
    """Where the node writes the server's output: ``logs/`` of its runtime folder, which holds
    the server's socket."""
    folder = Path(entry.unix_socket).parent if entry.unix_socket else runtime_dir
    return folder / "logs" / f"server-{entry.device.replace(':', '')}.log"


def _socket(entry: ServerEntry, trusted: frozenset[int], timeout_s: float) -> tuple[Finding, bool]:
    """The socket's finding, and whether this user can connect to it."""
    path = Path(entry.unix_socket or "")
    fallback = (
        f"; the client falls back to its TCP port {entry.tcp_address}, without shared memory"
        if entry.tcp_address
        else "; the server has no TCP port, so jobs here send its rows to the CPU fallback"
    )
    status: Status = "warn" if entry.tcp_address else "fail"
    facts: dict[str, Any] = {"path": str(path), "tcp_address": entry.tcp_address}
    try:
        check_node_socket(path, trusted, f"the socket of server {entry.device}", TRUST_FIX)
    except SocketMissing as exc:
        problem, fix = str(exc), "restart the node; the server makes its socket when it starts"
    except FileNotFoundError as exc:
        problem, fix = str(exc), "restart the node; the server makes its socket when it starts"
    except UntrustedNodeFile as exc:
        problem, fix = str(exc), TRUST_FIX
    else:
        problem, fix = _connect(path, timeout_s)
        if not problem:
            return (
                Finding(
                    group="sockets",
                    name=entry.device,
                    status="ok",
                    summary=f"{path} accepts connections from {describe_uid(os.geteuid())}",
                    facts=facts,
                ),
                True,
            )
    return (
        Finding(
            group="sockets",
            name=entry.device,
            status=status,
            summary=problem + fallback,
            fix=fix,
            facts=facts,
        ),
        False,
    )


def _connect(path: Path, timeout_s: float) -> tuple[str, str]:
    """Connect as this user: "" when it can, else the problem and its fix."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(str(path))
        except OSError as exc:
            return _connect_problem(path, exc)
    return "", ""


def _connect_problem(path: Path, exc: OSError) -> tuple[str, str]:
    me = describe_uid(os.geteuid())
    if exc.errno in (errno.EACCES, errno.EPERM):
        found = path.lstat()
        return (
            f"{path} refuses {me}: the socket has mode {stat.S_IMODE(found.st_mode):04o}, owner "
            f"{describe_uid(found.st_uid)}, group {found.st_gid} ({exc.strerror})",
            "run the executors as the node's user, or give the servers a socket mode that lets the "
            "executors' group in (udfserve node --server-args='--socket-mode 0660') and put the executors' "
            "user in the socket's group",
        )
    if exc.errno == errno.ECONNREFUSED:
        return (
            f"nothing listens on {path} (connection refused): its server is gone, or another process "
            "replaced the socket",
            "restart the node",
        )
    return f"cannot connect to {path}: {exc}", "restart the node"


def _ask(reached: ServerAnswers, targets: list[str], metadata: CallMetadata, timeout_s: float) -> None:
    """Health, then the repository index, on the first target that answers health."""
    if not targets:
        reached.health_error = "no address this user can reach (no usable socket, no TCP port)"
        return
    for target in targets:
        with grpc.insecure_channel(target) as channel:
            try:
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
                )
            except grpc.RpcError as exc:
                reached.health_error = f"{target}: {exc.code().name}: {exc.details()}"
                continue
            reached.target = target
            reached.health = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
            reached.health_error = ""
            try:
                index = pb_grpc.InferenceStub(channel).RepositoryIndex(
                    pb.RepositoryIndexRequest(ready_only=False), metadata=metadata, timeout=timeout_s
                )
            except grpc.RpcError as exc:
                reached.index_code, reached.index_error = exc.code(), str(exc.details())
            else:
                reached.index = list(index.models)
                reached.requires_token = _requires_token(channel, metadata, timeout_s)
                for item in reached.index:
                    if item.state == pb.VERSION_STATE_READY and item.version:
                        kept = reached.leased if item.reason.startswith("leased") else reached.serving
                        kept.setdefault(item.model, []).append(int(item.version))
            return


def _requires_token(channel: grpc.Channel, metadata: CallMetadata, timeout_s: float) -> bool:
    """Whether a server that accepted ``metadata`` refuses a call without it (False when no
    token was sent: the call just made says the server takes calls without one)."""
    if not metadata:
        return False
    try:
        pb_grpc.InferenceStub(channel).RepositoryIndex(
            pb.RepositoryIndexRequest(ready_only=True), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def _served_text(served: dict[str, list[int]], leased: dict[str, list[int]] | None = None) -> str:
    if not served:
        return "no model"
    parts = []
    for model, versions in sorted(served.items()):
        text = f"{model} version{'s' if len(versions) > 1 else ''} {_numbers(versions)}"
        kept = (leased or {}).get(model)
        if kept:
            text += (
                f" (and {_numbers(kept)}, leased to the jobs that pinned {'them' if len(kept) > 1 else 'it'})"
            )
        parts.append(text)
    return ", ".join(parts)


def _numbers(versions: list[int]) -> str:
    return ", ".join(map(str, sorted(versions)))


def _server_findings(reached: ServerAnswers, runtime_dir: Path) -> list[Finding]:
    entry = reached.entry
    log = _server_log(entry, runtime_dir)
    facts: dict[str, Any] = {"pid": entry.pid, "target": reached.target, "health": reached.health}
    if reached.target is None:
        return [
            Finding(
                group="servers",
                name=entry.device,
                status="fail",
                summary=f"listed ready, but its health check is not answered ({reached.health_error})",
                fix=f"its log: {log}; restart the node if the server hangs",
                facts=facts,
            )
        ]
    if reached.index is not None:
        served, source = reached.serving, ""
        facts["serving"] = {model: sorted(versions) for model, versions in served.items()}
        facts["leased"] = {model: sorted(versions) for model, versions in reached.leased.items()}
    else:
        served = {model: entry.versions.get(model, []) for model in entry.models}
        source = f" (as the discovery file lists them: its index answered {reached.index_error_text()})"
        facts["serving"] = served
    if reached.health != "SERVING":
        return [
            Finding(
                group="servers",
                name=entry.device,
                status="fail",
                summary=f"health {reached.health} over {reached.target}: it takes no request; serves "
                f"{_served_text(served)}{source}",
                fix=f"its log: {log}",
                facts=facts,
            )
        ]
    findings = [
        Finding(
            group="servers",
            name=entry.device,
            status="ok",
            summary=f"health SERVING over {reached.target} (pid {entry.pid}); serves "
            f"{_served_text(served, reached.leased)}"
            f"{source}",
            facts=facts,
        )
    ]
    for item in reached.index or []:
        failed = item.state == pb.VERSION_STATE_UNAVAILABLE and item.reason not in NOT_A_FAILURE
        if failed:
            version = f" version {item.version}" if item.version else ""
            findings.append(
                Finding(
                    group="servers",
                    name=f"{entry.device} {item.model}{version}",
                    status="warn",
                    summary=f"not served: {item.reason}",
                    fix=f"correct the model's folder in the repository; the server's log: {log}",
                    facts={"model": item.model, "version": item.version, "reason": item.reason},
                )
            )
    return findings


def _versions_agree(answers: list[ServerAnswers]) -> list[Finding]:
    """A model served in other versions on some devices than on others: jobs see the version of
    whichever device takes their task (a rollout under way, or a load that failed somewhere)."""
    by_model: dict[str, dict[str, tuple[int, ...]]] = {}
    for reached in answers:
        if reached.index is None:
            continue
        for model, versions in reached.serving.items():
            by_model.setdefault(model, {})[reached.entry.device] = tuple(sorted(versions))
    findings = []
    for model, devices in sorted(by_model.items()):
        asked = [reached.entry.device for reached in answers if reached.index is not None]
        missing = [device for device in asked if device not in devices]
        if len(set(devices.values())) > 1 or missing:
            listed = "; ".join(f"{device}: {', '.join(map(str, v))}" for device, v in sorted(devices.items()))
            absent = f"; not served on {', '.join(missing)}" if missing else ""
            findings.append(
                Finding(
                    group="servers",
                    name=f"{model} versions",
                    status="warn",
                    summary=f"the devices serve different versions ({listed}{absent}): a job of "
                    "version_consistency='request' gets the version of the device its task lands on; a job "
                    "pinned to its version (the default, 'job') has it loaded for it on each device that "
                    "lacks it, at the cost of a load there",
                    fix="wait for the rollout to finish, or load the version on every device "
                    "(`udfserve models load`)",
                    facts={
                        "versions": {device: list(v) for device, v in devices.items()},
                        "missing": missing,
                    },
                )
            )
    return findings
