"""Keeping each device's model server running: start it, wait until it serves, restart it with
back-off when it exits or fails to start, and stop every server with SIGTERM, then SIGKILL.

A server that exits, or does not become ready (in time, or at all: one that finished loading
with no model to serve says so in its ready file), is started again after a back-off that
doubles up to a maximum and goes back to the initial delay once a server has stayed up long
enough; the reason of its last failed start is kept in its slot (``problem``). Every server
holds the read end of the supervisor's lifeline pipe (``--lifeline-fd``), so none outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable

import grpc

from udfserve.discovery import ServerState
from udfserve.services.model_server.launcher import (
    ServerProcess,
    ServerStartError,
    launch_server,
    wait_until_serving,
)
from udfserve.services.node.admin import SupervisorMetrics
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.ready_file import ReadyFileWatch
from udfserve.services.node.server_slot import ServerSlot, describe_served

logger = logging.getLogger(__name__)

KILL_MARGIN_S = 5.0  # past a server's own grace period, before SIGKILL


class ServerKeeper:
    """Runs the servers of the node's slots until ``stopping`` is set; ``set_state`` records and
    publishes each change of a slot's state."""

    def __init__(
        self,
        config: NodeConfig,
        metrics: SupervisorMetrics,
        stopping: asyncio.Event,
        set_state: Callable[[ServerSlot, ServerState], None],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._stopping = stopping
        self._set_state = set_state
        self.lifeline_fd: int | None = None
        """The read end of the pipe every server watches (``lifeline.py``), once it is made."""

    async def run(self, slot: ServerSlot) -> None:
        """Start ``slot``'s server, and again after each exit, until the node stops."""
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
            lifeline_fd=self.lifeline_fd,
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
                describe_served(served),
            )
        return time.monotonic()

    async def stop(self, slots: list[ServerSlot], tasks: list[asyncio.Task[None]]) -> None:
        """SIGTERM every server, SIGKILL those still running past their grace period and
        ``KILL_MARGIN_S``, and wait for every slot's task (``run``) to end."""
        for slot in slots:
            if slot.process is not None:
                slot.process.process.send_signal(signal.SIGTERM)
        _, pending = await asyncio.wait(tasks, timeout=self.config.grace_period_s + KILL_MARGIN_S)
        if pending:
            for slot in slots:
                if slot.process is not None and slot.process.process.returncode is None:
                    logger.warning(
                        "model server on %s (pid %d) still running %.1f s after SIGTERM; killing it",
                        slot.device.device,
                        slot.process.pid,
                        self.config.grace_period_s + KILL_MARGIN_S,
                    )
                    slot.process.process.kill()
            await asyncio.wait(pending)
