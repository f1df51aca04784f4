"""Start a model server as a child process and wait until it serves.

Used by the node supervisor, the demo, the benchmarks and the tests: the child writes its
bound addresses to a ready file once listening; readiness is then taken from the standard
gRPC health service (``Watch``, in slices of a second between which the child's exit and its
ready file are looked at), with a deadline, failing early if the child exits or says it serves
no model.

The child's environment keeps glibc's freed memory in the process (``ALLOCATOR_ENV``): with
glibc's defaults every buffer above 128 KiB is returned to the system when freed and faulted in
again, page by page, for the next request, which costs more than copying the payload. The cost
is up to ``MALLOC_TRIM_THRESHOLD_`` (1 GiB) of freed memory kept by the process. A value already
in the environment wins; an empty one leaves glibc's default.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ALLOCATOR_ENV: Mapping[str, str] = {
    # Buffers up to 32 MiB come from the heap instead of their own mmap, and are reused when freed.
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    # Freed memory goes back to the system only beyond 1 GiB at the top of the heap.
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}
"""glibc settings a model server starts with unless its environment sets them."""


def server_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server child: ``env`` (default: this process's) with ``ALLOCATOR_ENV``
    added where it sets no value; a variable set empty is removed, leaving glibc's default."""
    child_env = {**ALLOCATOR_ENV, **(os.environ if env is None else env)}
    for name in ALLOCATOR_ENV:
        if not child_env[name]:
            del child_env[name]
    return child_env


class ServerStartError(RuntimeError):
    """The child exited or did not become ready in time; the message carries its log tail after
    ``reason``, the one line that says what went wrong."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(f"{reason}; log tail:\n{log_tail}" if log_tail else reason)
        self.reason = reason


class ServerNotServing(ServerStartError):
    """The child finished loading with no model to serve; the message is its own reason (what its
    repository holds, or the models' errors). It stays up NOT_SERVING until stopped."""


@dataclass
class ServerProcess:
    """A model server child process and where it listens."""

    process: subprocess.Popen[bytes]
    ready_file: Path
    log_path: Path | None
    addresses: dict[str, object] = field(default_factory=dict)
    scratch_dir: Path | None = None
    """The folder made for the ready file when none was given; removed once the child has exited."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def unix_socket(self) -> str | None:
        value = self.addresses.get("unix_socket")
        return str(value) if value else None

    @property
    def tcp_address(self) -> str | None:
        value = self.addresses.get("tcp_address")
        return str(value) if value else None

    @property
    def http_address(self) -> str | None:
        value = self.addresses.get("http_address")
        return str(value) if value else None

    @property
    def kserve_address(self) -> str | None:
        """``--kserve-port``'s host:port (the native KServe front end, or ``auto``'s python
        fallback), else None."""
        value = self.addresses.get("kserve_address")
        return str(value) if value else None

    @property
    def kserve_socket(self) -> str | None:
        """``--kserve-socket``'s path (the native KServe front end, or ``auto``'s python fallback),
        else None."""
        value = self.addresses.get("kserve_socket")
        return str(value) if value else None

    @property
    def kserve_frontend(self) -> str | None:
        """The KServe front end that serves (``native`` or ``python``); None before the ready file."""
        value = self.addresses.get("kserve_frontend")
        return str(value) if value else None

    @property
    def kserve_http_address(self) -> str | None:
        """The KServe HTTP port's host:port (``--kserve-http-port``), else None."""
        value = self.addresses.get("kserve_http_address")
        return str(value) if value else None

    def kserve_target(self) -> str:
        """Where unary KServe calls go: ``--kserve-port``'s address, else the main TCP address."""
        if self.kserve_address:
            return self.kserve_address
        if self.tcp_address:
            return self.tcp_address
        return self.grpc_target()

    def grpc_target(self, prefer_unix: bool = True) -> str:
        if self.unix_socket and (prefer_unix or not self.tcp_address):
            return f"unix://{self.unix_socket}"
        if self.tcp_address:
            return self.tcp_address
        raise ServerStartError("the server listens on no gRPC address")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log file)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for the graceful exit; SIGKILL if it does not come. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self._exited(self.process.wait(timeout=timeout_s))
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self._exited(self.process.wait())

    def kill(self) -> int:
        if self.process.poll() is None:
            self.process.kill()
        return self._exited(self.process.wait())

    def _exited(self, code: int) -> int:
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)
        return code


def serve_arguments(
    model_repository: Path,
    *,
    device: str = "cpu",
    socket: Path | None = None,
    port: int | None = 0,
    http_port: int | None = 0,
    ready_file: Path,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The flags of ``udfserve serve`` for a server of these settings (``extra_args`` last)."""
    arguments = [
        "--model-repository",
        str(model_repository),
        "--device",
        device,
        "--ready-file",
        str(ready_file),
        "--port",
        "off" if port is None else str(port),
        "--http-port",
        "off" if http_port is None else str(http_port),
    ]
    if socket is not None:
        arguments += ["--socket", str(socket)]
    return arguments + list(extra_args)


def server_command(arguments: Sequence[str]) -> list[str]:
    """The command line of ``udfserve serve`` run with this interpreter (``serve_arguments``)."""
    return [sys.executable, "-m", "udfserve", "serve", *arguments]


def launch_server(
    model_repository: Path,
    *,
    device: str = "cpu",
    socket: Path | None = None,
    port: int | None = 0,
    http_port: int | None = 0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    ready_timeout_s: float = 120.0,
    wait: bool = True,
    ready_file: Path | None = None,
    health_credentials: grpc.ChannelCredentials | None = None,
    lifeline_fd: int | None = None,
) -> ServerProcess:
    """Start ``udfserve serve`` as a child; by default wait until its health service says SERVING
    (a child that does not is killed, and the wait's ``ServerStartError`` raised).

    ``env`` (default: this process's environment) is the child's, with ``ALLOCATOR_ENV`` added
    (``server_env``).

    ``health_credentials`` are for a server reachable only over TLS (no unix socket): the
    health check then goes to 127.0.0.1 on its TCP port with those credentials.

    ``ready_file`` (default: a new temporary folder) is removed first: a child killed earlier
    leaves its file behind, and its addresses must not be taken for the new child's.

    ``lifeline_fd``, the read end of a pipe whose write end this process keeps, is handed to the
    child (``--lifeline-fd``, same number): the child drains and exits once this process is gone.
    """
    scratch_dir = None
    if ready_file is None:
        scratch_dir = Path(tempfile.mkdtemp(prefix="udfserve-ready-"))
        ready_file = scratch_dir / "ready.json"
    else:
        ready_file.unlink(missing_ok=True)
    command = server_command(
        serve_arguments(
            model_repository,
            device=device,
            socket=socket,
            port=port,
            http_port=http_port,
            ready_file=ready_file,
            extra_args=[
                *extra_args,
                *(["--lifeline-fd", str(lifeline_fd)] if lifeline_fd is not None else []),
            ],
        )
    )
    log: IO[bytes] | int = subprocess.DEVNULL
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 (the child owns it for its lifetime)
    try:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(env),
            pass_fds=() if lifeline_fd is None else (lifeline_fd,),
        )
    finally:
        if not isinstance(log, int):
            log.close()
    server = ServerProcess(process=process, ready_file=ready_file, log_path=log_path, scratch_dir=scratch_dir)
    if wait:
        try:
            wait_until_serving(server, ready_timeout_s, health_credentials)
        except BaseException:
            server.kill()  # the caller gets no handle on a child that failed to start
            raise
    return server


def _health_channel(server: ServerProcess, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(server.grpc_target())
    port = (server.tcp_address or "").rsplit(":", 1)[-1]
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials)


WATCH_SLICE_S = 1.0
"""How long one health Watch lasts before the child's exit and its ready file are looked at."""


def wait_until_serving(
    server: ServerProcess, timeout_s: float, credentials: grpc.ChannelCredentials | None = None
) -> None:
    """Block until the server listens and its health service reports SERVING for all models.

    Raises ``ServerNotServing`` as soon as the ready file says loading finished with no model
    to serve, and ``ServerStartError`` when the child exits or the time runs out.
    """
    deadline = time.monotonic() + timeout_s
    _wait_for_ready_file(server, deadline)
    with _health_channel(server, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                for update in stub.Watch(
                    health_pb2.HealthCheckRequest(service=""), timeout=min(remaining, WATCH_SLICE_S)
                ):
                    if update.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise
            _fail_if_exited(server)
            _fail_if_not_serving(server)
    raise ServerStartError(f"server pid {server.pid} not serving after {timeout_s:.0f} s", server.log_tail())


def _wait_for_ready_file(server: ServerProcess, deadline: float) -> None:
    # The ready file appears within the child's start-up (about a second: imports, bind);
    # the short pause between looks keeps this cheap. Health is watched, not polled, after it.
    while not server.ready_file.exists():
        _fail_if_exited(server)
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"server pid {server.pid} did not start listening in time", server.log_tail()
            )
        time.sleep(0.05)
    server.addresses = json.loads(server.ready_file.read_text())


def _fail_if_not_serving(server: ServerProcess) -> None:
    try:
        reason = json.loads(server.ready_file.read_text()).get("not_serving", "")
    except (OSError, ValueError):
        return  # being replaced, or gone with a child that is exiting: the next look tells
    if reason:
        raise ServerNotServing(f"server pid {server.pid} serves no model: {reason}")


def _fail_if_exited(server: ServerProcess) -> None:
    code = server.process.poll()
    if code is not None:
        raise ServerStartError(f"server exited with code {code} during start-up", server.log_tail())
