"""What the node supervisor publishes about its servers: the discovery file the Spark clients
read, and the Prometheus targets file, both rewritten atomically from the slots' states.

Every change of state rewrites both: a server that is not ready stays listed with its state
("starting", "restarting", "stopping") and without addresses, so the Spark client, which only uses
ready servers, never dials a dead one. Between changes the discovery file is rewritten every
``--discovery-heartbeat-s`` (its ``updated_at`` is the heartbeat), with the models and versions of
servers whose ready file changed: readers take a file older than ``--discovery-stale-after-s`` for
absent, so the servers of a node killed whole are not dialled at dead sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os

from udfserve.discovery import NodeDiscovery, ServerEntry, write_discovery
from udfserve.services.node.admin import SupervisorMetrics
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.server_slot import ServerSlot, describe_served
from udfserve.services.node.targets import server_target, supervisor_target, write_targets

logger = logging.getLogger(__name__)


class NodePublisher:
    """Writes the discovery and targets files of ``slots`` until ``close``, which removes them."""

    def __init__(self, config: NodeConfig, slots: list[ServerSlot], metrics: SupervisorMetrics) -> None:
        self.config = config
        self.slots = slots
        self.metrics = metrics
        self.supervisor_address: str | None = None
        """The supervisor's own admin address, listed in the targets file once it listens."""
        self.closed = False

    def publish(self) -> None:
        """Rewrite the Prometheus targets file, then the discovery file, from the slots' states.

        Targets first: whoever reads a state change in the discovery file (a client, a test, an
        operator) finds the targets file already showing it, so nothing that learnt of a dead
        server from the discovery file sees it still scraped."""
        if self.closed:
            return
        config = self.config
        entries = [slot.entry() for slot in self.slots]
        targets = [
            server_target(entry, config.node, config.advertise_host)
            for entry in entries
            if entry.state == "ready" and entry.http_address
        ]
        if self.supervisor_address is not None:
            targets.append(supervisor_target(self.supervisor_address, config.node, config.advertise_host))
        write_targets(config.targets_path, targets)
        self.write_discovery(entries)

    def write_discovery(self, entries: list[ServerEntry] | None = None) -> None:
        """Rewrite the discovery file with ``entries`` (default: the slots' entries now), stamped
        with the time now."""
        config = self.config
        if entries is None:
            entries = [slot.entry() for slot in self.slots]
        discovery = NodeDiscovery(
            node=config.node,
            supervisor_pid=os.getpid(),
            model_repository=str(config.model_repository),
            metrics_targets_file=str(config.targets_path),
            fallback_reports_dir=str(config.fallback_reports_dir),
            heartbeat_s=config.discovery_heartbeat_s,
            stale_after_s=config.discovery_stale_after_s,
            servers=entries,
        )
        write_discovery(config.discovery_path, discovery)
        self.metrics.discovery_written.set(discovery.updated_at)

    async def heartbeat(self) -> None:
        """Rewrite the discovery file every heartbeat, so that its age tells readers the
        supervisor lives, with the models and versions of servers whose ready file changed; a
        file that cannot be written stops the node, as at a change."""
        while True:
            await asyncio.sleep(self.config.discovery_heartbeat_s)
            if not self.closed:
                self._read_changed_ready_files()
                self.write_discovery()  # the targets file changes only with the servers' states

    def _read_changed_ready_files(self) -> None:
        """Take up what each ready server serves now, if its ready file was rewritten."""
        for slot in self.slots:
            served = slot.watch.changed() if slot.watch is not None and slot.state == "ready" else None
            if served is not None and served != slot.served:
                slot.served = served
                logger.info("model server on %s now serves %s", slot.device.device, describe_served(served))

    def close(self) -> None:
        """Stop publishing and remove both files, and the ready files of servers that were killed."""
        self.closed = True
        self.config.discovery_path.unlink(missing_ok=True)
        self.config.targets_path.unlink(missing_ok=True)
        for slot in self.slots:
            slot.ready_file.unlink(missing_ok=True)  # left behind by a server that was killed
