"""The node supervisor: one model server per device, a discovery file, restarts with back-off.

For each device slot (``server_slot.py``) a task keeps the server running (``server_keeper.py``:
``<runtime>/server-<device>.sock``, TCP and HTTP ports 0 unless base ports are set; it waits for
the gRPC health service to say SERVING, lists the server's models and their versions from its
ready file, then waits for the process to exit, and starts it again after a back-off). A server
whose versions change while it runs (``--model-control poll|explicit``) rewrites its ready file;
the supervisor takes that up at the next heartbeat (``ready_file.py``). Every change of state
rewrites the discovery file and the Prometheus targets file atomically (``publishing.py``), and
the discovery file is rewritten every ``--discovery-heartbeat-s`` between changes; the reason of
a server's last failed start is in its discovery entry (``problem``) and in the supervisor's
``/health/ready``.

Every server holds the read end of one pipe whose write end only the supervisor holds
(``--lifeline-fd``): when the supervisor dies, even by SIGKILL, the kernel closes it and every
server drains and exits on its own, so none is left running as an orphan.

SIGTERM or SIGINT: every server is marked "stopping" and sent SIGTERM (it drains within its
grace period), SIGKILL follows if one is still alive 5 s after the grace period; then the
discovery and targets files are removed, the lock is released, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

from udfserve.discovery import ServerState
from udfserve.services.node.admin import AdminServer, SupervisorMetrics
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceSlot, GpuDetection
from udfserve.services.node.fallback_metrics import prepare_reports_folder
from udfserve.services.node.leases import LeaseWatch, release_starter_lock
from udfserve.services.node.lock import NodeLock
from udfserve.services.node.publishing import NodePublisher
from udfserve.services.node.runtime_dir import SHARED_MODE, prepare_runtime_dir
from udfserve.services.node.server_keeper import ServerKeeper
from udfserve.services.node.server_slot import ServerSlot
from udfserve.services.process_setup import stop_on_signals

logger = logging.getLogger(__name__)


class Supervisor:
    """Runs the node's servers until SIGTERM/SIGINT; ``run`` returns the exit code."""

    def __init__(self, config: NodeConfig, devices: list[DeviceSlot], detection: GpuDetection) -> None:
        if not devices:
            raise ValueError("a supervisor needs at least one device to serve on")
        self.config = config
        self.detection = detection
        self.slots = [ServerSlot(device, i, config) for i, device in enumerate(devices)]
        self.metrics = SupervisorMetrics(
            [s.device.device for s in self.slots], config.discovery_stale_after_s, config.fallback_reports_dir
        )
        self.lock = NodeLock(config.lock_path)
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._admin: AdminServer | None = None
        self.publisher = NodePublisher(config, self.slots, self.metrics)
        self.keeper = ServerKeeper(config, self.metrics, self._stopping, self._set_state)
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
        prepare_reports_folder(config.fallback_reports_dir, shared=config.runtime_dir_mode == SHARED_MODE)
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
        # the pipe whose read end every server watches (``lifeline.py``); both ends close on exec:
        # a server gets only what it is passed
        lifeline = os.pipe()
        self.keeper.lifeline_fd = lifeline[0]
        self._admin = AdminServer(
            config.supervisor_http_host, config.supervisor_http_port, self.metrics, self.health
        )
        self._admin.start()
        self.publisher.supervisor_address = self._admin.address
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
                self.publisher.publish()
                tasks = [
                    asyncio.create_task(self.keeper.run(slot), name=slot.device.device) for slot in self.slots
                ]
                for task in tasks:
                    task.add_done_callback(self._on_slot_done)
                heartbeat = asyncio.create_task(self.publisher.heartbeat(), name="the discovery heartbeat")
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
            self.publisher.close()
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

    async def _stop_servers(self, tasks: list[asyncio.Task[None]]) -> None:
        for slot in self.slots:
            slot.state = "stopping"
        try:
            self.publisher.publish()
        except OSError:  # a full or read-only disk: the servers must stop all the same
            logger.exception("could not publish the servers as stopping in %s", self.config.discovery_path)
        await self.keeper.stop(self.slots, tasks)

    def _set_state(self, slot: ServerSlot, state: ServerState) -> None:
        if self._stopping.is_set():
            return  # "stopping" is final
        slot.state = state
        self.publisher.publish()
