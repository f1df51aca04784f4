"""The node supervisor: one model server per device, a discovery file, restarts with back-off.

For each device slot a task starts the server (``<runtime>/server-<device>.sock``, TCP and HTTP
ports 0 unless base ports are set), waits for the gRPC health service to say SERVING, lists its
models and their versions from its ready file, then waits for the process to exit. A server
whose versions change while it runs (``--model-control poll|explicit``) rewrites its ready
file; the supervisor takes that up at the next heartbeat (``ready_file.py``). Every change of
state rewrites the discovery file and the Prometheus targets file atomically: a server that is
not ready stays listed with its state ("starting", "restarting", "stopping") and without
addresses, so the Spark client, which only uses ready servers, never dials a dead one. A server
that exits, or does not become ready (in time, or at all: one that finished loading with no
model to serve says so in its ready file), is started again after a back-off that doubles up to
a maximum and goes back to the initial delay once a server has stayed up long enough; the
reason of its last failed start is in its discovery entry (``problem``) and in the supervisor's
``/health/ready``. Between changes the discovery file is rewritten every
``--discovery-heartbeat-s`` (its ``updated_at`` is the heartbeat): readers take a file older
than ``--discovery-stale-after-s`` for absent, so the servers of a node killed whole are not
dialled at dead sockets.

Every server holds the read end of one pipe whose write end only the supervisor holds
(``--lifeline-fd``): when the supervisor dies, even by SIGKILL, the kernel closes it and every
server drains and exits on its own, so none is left running as an orphan.

SIGTERM or SIGINT: every server is marked "stopping" and sent SIGTERM (it drains within its
grace period), SIGKILL follows if one is still alive 5 s after the grace period; then the
discovery and targets files are removed, the lock is released, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from udfserve.discovery import NodeDiscovery, ServerEntry, ServerState, write_discovery
from udfserve.services.model_server.launcher import (
    ServerProcess,
    ServerStartError,
    launch_server,
    serve_arguments,
    wait_until_serving,
)
from udfserve.services.node.admin import AdminServer, SupervisorMetrics
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot, GpuDetection
from udfserve.services.node.leases import LeaseWatch, release_starter_lock
from udfserve.services.node.lock import NodeLock
from udfserve.services.node.ready_file import ReadyFileWatch, ServedModels
from udfserve.services.node.runtime_dir import SHARED_MODE, prepare_runtime_dir
from udfserve.services.node.targets import server_target, supervisor_target, write_targets
from udfserve.services.process_setup import stop_on_signals

logger = logging.getLogger(__name__)

KILL_MARGIN_S = 5.0  # past a server's own grace period, before SIGKILL


class ServerSlot:
    """One device's server as the supervisor tracks it across restarts."""

    def __init__(self, device: DeviceSlot, position: int, config: NodeConfig) -> None:
        self.device = device
        self.socket_path = config.runtime_dir / f"server-{device.slug}.sock"
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
        return config.server_flags(self.device) + config.server_extra_args

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
            pid=self.process.pid if self.process is not None else None,
            models=list(self.served.models) if ready else [],
            versions=dict(self.served.versions) if ready else {},
            state=self.state,
            problem=self.problem or None,
        )


class Supervisor:
    """Runs the node's servers until SIGTERM/SIGINT; ``run`` returns the exit code."""

    def __init__(self, config: NodeConfig, devices: list[DeviceSlot], detection: GpuDetection) -> None:
        if not devices:
            raise ValueError("a supervisor needs at least one device to serve on")
        self.config = config
        self.detection = detection
        self.slots = [ServerSlot(device, i, config) for i, device in enumerate(devices)]
        self.metrics = SupervisorMetrics(
            [s.device.device for s in self.slots], config.discovery_stale_after_s
        )
        self.lock = NodeLock(config.lock_path)
        self._stopping = asyncio.Event()
        self._closed = False
        self._exit_code = 0
        self._admin: AdminServer | None = None
        self._lifeline: tuple[int, int] | None = None
        """The pipe (read end, write end) whose read end every server watches (``lifeline.py``)."""
        self.leases = (
            LeaseWatch(config.runtime_dir, config.node, config.lease_poll_s, config.lease_timeout_s)
            if config.leases
            else None
        )
        """With ``--leases``: the applications holding the node (``leases.py``)."""

    async def run(self) -> int:
        """Check the runtime folder (RuntimeDirRefused when another user could write it), take the
        node's lock (NodeLockHeld if another supervisor has it), serve, clean up."""
        config = self.config
        prepare_runtime_dir(config.runtime_dir, config.runtime_dir_mode)
        if config.discovery_path.parent != config.runtime_dir:
            prepare_runtime_dir(config.discovery_path.parent, SHARED_MODE, "the discovery file's folder")
        self.lock.acquire()
        release_starter_lock(config.starter_lock_fd)
        try:
            return await self._run_locked()
        finally:
            self.lock.release()
            if self.leases is not None:
                self.leases.close()

    async def _run_locked(self) -> int:
        config = self.config
        loop = asyncio.get_running_loop()
        # Each slot keeps a thread blocked on its child; shutdown must never queue behind them.
        executor = ThreadPoolExecutor(max_workers=2 * len(self.slots) + 4, thread_name_prefix="supervisor")
        loop.set_default_executor(executor)
        lifeline = self._lifeline = os.pipe()  # both ends close on exec: a server gets only what it is passed
        self._admin = AdminServer(
            config.supervisor_http_host, config.supervisor_http_port, self.metrics, self.health
        )
        self._admin.start()
        try:
            with stop_on_signals(self._on_signal):
                logger.info(
                    "node %s: %s; serving on %s; discovery file %s; supervisor http://%s",
                    config.node,
                    self.detection.describe(),
                    ", ".join(s.device.device for s in self.slots),
                    config.discovery_path,
                    self._admin.address,
                )
                self._publish()
                tasks = [
                    asyncio.create_task(self._run_slot(slot), name=slot.device.device) for slot in self.slots
                ]
                for task in tasks:
                    task.add_done_callback(self._on_slot_done)
                heartbeat = asyncio.create_task(self._heartbeat(), name="the discovery heartbeat")
                heartbeat.add_done_callback(self._on_slot_done)
                watches = [heartbeat]
                if self.leases is not None:
                    watch = asyncio.create_task(self.leases.run(self._on_no_lease), name="the lease watch")
                    watch.add_done_callback(self._on_slot_done)
                    watches.append(watch)
                await self._stopping.wait()
                for watch in watches:
                    watch.cancel()
                await self._stop_servers(tasks)
        finally:
            self._closed = True
            config.discovery_path.unlink(missing_ok=True)
            config.targets_path.unlink(missing_ok=True)
            for slot in self.slots:
                slot.ready_file.unlink(missing_ok=True)  # left behind by a server that was killed
            self._admin.stop()
            for fd in lifeline:  # the servers are gone: nobody watches it any more
                os.close(fd)
            executor.shutdown(wait=False)
        logger.info("node supervisor stopped")
        return self._exit_code

    def health(self) -> tuple[bool, dict[str, object]]:
        """Ready when every server is ready; ``problems`` says why each server that failed its
        last start is not, ``versions`` each ready server's models and versions. Called from the
        admin thread (each slot's ``served`` is replaced whole, never changed in place)."""
        states = {slot.device.device: slot.state for slot in self.slots}
        detail: dict[str, object] = {
            "node": self.config.node,
            "servers": states,
            "problems": {slot.device.device: slot.problem for slot in self.slots if slot.problem},
            "versions": {
                slot.device.device: slot.served.versions for slot in self.slots if slot.state == "ready"
            },
            "gpus_found": self.detection.count,
            "gpu_detection": self.detection.reason or "ok",
        }
        if self.leases is not None:
            detail["leases"] = self.leases.describe()
        return all(state == "ready" for state in states.values()), detail

    def _on_signal(self, signum: int) -> None:
        if self._stopping.is_set():
            logger.info("received %s again; still stopping", signal.Signals(signum).name)
            return
        logger.info("received %s: stopping every server", signal.Signals(signum).name)
        self._stopping.set()

    def _on_no_lease(self) -> None:
        logger.info("no application holds a lease on this node any more: stopping every server")
        self._stopping.set()

    def _on_slot_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        logger.error("supervising %s failed; stopping the node", task.get_name(), exc_info=task.exception())
        self._exit_code = 1
        self._stopping.set()

    async def _run_slot(self, slot: ServerSlot) -> None:
        config = self.config
        delay_s = config.restart_backoff_initial_s
        launches = 0
        while not self._stopping.is_set():
            if launches:
                self.metrics.restarts.labels(device=slot.device.device).inc()
            launches += 1
            slot.watch = None
            slot.process = self._launch(slot)
            self._set_state(slot, "starting" if launches == 1 else "restarting")
            ready_since = await self._wait_ready(slot)
            if ready_since is not None:
                code = await asyncio.to_thread(slot.process.process.wait)
                self.metrics.server_ready.labels(device=slot.device.device).set(0)
                if self._stopping.is_set():
                    logger.info(
                        "model server on %s (pid %d) exited with code %d",
                        slot.device.device,
                        slot.process.pid,
                        code,
                    )
                    break
                if time.monotonic() - ready_since >= config.restart_backoff_reset_s:
                    delay_s = config.restart_backoff_initial_s
                logger.warning(
                    "model server on %s (pid %d) exited with code %d; restarting in %.1f s; log %s",
                    slot.device.device,
                    slot.process.pid,
                    code,
                    delay_s,
                    slot.log_path,
                )
            elif self._stopping.is_set():
                break
            slot.process = None
            self._set_state(slot, "restarting")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay_s)
            delay_s = min(delay_s * 2, config.restart_backoff_max_s)

    async def _heartbeat(self) -> None:
        """Rewrite the discovery file every heartbeat, so that its age tells readers the
        supervisor lives, with the models and versions of servers whose ready file changed; a
        file that cannot be written stops the node, as at a change."""
        while True:
            await asyncio.sleep(self.config.discovery_heartbeat_s)
            if not self._closed:
                self._read_changed_ready_files()
                self._write_discovery()  # the targets file changes only with the servers' states

    def _read_changed_ready_files(self) -> None:
        """Take up what each ready server serves now, if its ready file was rewritten."""
        for slot in self.slots:
            served = slot.watch.changed() if slot.watch is not None and slot.state == "ready" else None
            if served is not None and served != slot.served:
                slot.served = served
                logger.info("model server on %s now serves %s", slot.device.device, _describe(served))

    def _launch(self, slot: ServerSlot) -> ServerProcess:
        config = self.config
        process = launch_server(
            config.model_repository,
            device=slot.device.device,
            socket=slot.socket_path,
            port=slot.port,
            http_port=slot.http_port,
            extra_args=slot.server_args(config),
            log_path=slot.log_path,
            wait=False,
            ready_file=slot.ready_file,
            lifeline_fd=self._lifeline[0] if self._lifeline is not None else None,
        )
        logger.info("started model server on %s: pid %d", slot.device.device, process.pid)
        return process

    async def _wait_ready(self, slot: ServerSlot) -> float | None:
        """Wait for the server to serve; the monotonic time it became ready, or None if it did not."""
        process = slot.process
        assert process is not None
        try:
            await asyncio.to_thread(wait_until_serving, process, self.config.start_timeout_s)
            watch = ReadyFileWatch(slot.ready_file)
            served = watch.read()
        except (ServerStartError, grpc.RpcError, OSError, ValueError) as exc:
            if not self._stopping.is_set():
                logger.warning("model server on %s did not become ready: %s", slot.device.device, exc)
                slot.problem = exc.reason if isinstance(exc, ServerStartError) else str(exc)
            await asyncio.to_thread(process.kill)
            return None
        slot.served, slot.watch = served, watch
        slot.problem = ""
        self._set_state(slot, "ready")
        if slot.state == "ready":
            self.metrics.server_ready.labels(device=slot.device.device).set(1)
            logger.info(
                "model server on %s ready: pid %d, %s, serving %s",
                slot.device.device,
                process.pid,
                " ".join(a for a in (process.unix_socket, process.tcp_address) if a),
                _describe(served),
            )
        return time.monotonic()

    async def _stop_servers(self, tasks: list[asyncio.Task[None]]) -> None:
        for slot in self.slots:
            slot.state = "stopping"
        try:
            self._publish()
        except OSError:  # a full or read-only disk: the servers must stop all the same
            logger.exception("could not publish the servers as stopping in %s", self.config.discovery_path)
        for slot in self.slots:
            if slot.process is not None:
                slot.process.process.send_signal(signal.SIGTERM)
        _, pending = await asyncio.wait(tasks, timeout=self.config.grace_period_s + KILL_MARGIN_S)
        if pending:
            for slot in self.slots:
                if slot.process is not None and slot.process.process.returncode is None:
                    logger.warning(
                        "model server on %s (pid %d) still running %.1f s after SIGTERM; killing it",
                        slot.device.device,
                        slot.process.pid,
                        self.config.grace_period_s + KILL_MARGIN_S,
                    )
                    slot.process.process.kill()
            await asyncio.wait(pending)

    def _set_state(self, slot: ServerSlot, state: ServerState) -> None:
        if self._stopping.is_set():
            return  # "stopping" is final
        slot.state = state
        self._publish()

    def _publish(self) -> None:
        """Rewrite the discovery file and the Prometheus targets file from the slots' states."""
        if self._closed:
            return
        config = self.config
        entries = self._write_discovery()
        targets = [
            server_target(entry, config.node, config.advertise_host)
            for entry in entries
            if entry.state == "ready" and entry.http_address
        ]
        if self._admin is not None:
            targets.append(supervisor_target(self._admin.address, config.node, config.advertise_host))
        write_targets(config.targets_path, targets)

    def _write_discovery(self) -> list[ServerEntry]:
        """Rewrite the discovery file, stamped with the time now; the entries written."""
        config = self.config
        entries = [slot.entry() for slot in self.slots]
        discovery = NodeDiscovery(
            node=config.node,
            supervisor_pid=os.getpid(),
            model_repository=str(config.model_repository),
            metrics_targets_file=str(config.targets_path),
            heartbeat_s=config.discovery_heartbeat_s,
            stale_after_s=config.discovery_stale_after_s,
            servers=entries,
        )
        write_discovery(config.discovery_path, discovery)
        self.metrics.discovery_written.set(discovery.updated_at)
        return entries


def _describe(served: ServedModels) -> str:
    """``tabular_mlp 1,2, text_hashing 3`` (a model without listed versions by its name alone)."""
    parts = [
        f"{name} {','.join(map(str, served.versions[name]))}" if served.versions.get(name) else name
        for name in served.models
    ]
    return ", ".join(parts) or "no model"
