"""``udfserve node``: detect the devices, plan one server per device, supervise them."""

from __future__ import annotations

import argparse
import asyncio
import logging

import prometheus_client

from udfserve.services.node.admin import AdminAddressUnavailable
from udfserve.services.node.config import NodeConfig
from udfserve.services.node.devices import DeviceError, detect_gpus, plan_devices
from udfserve.services.node.lock import NodeLockHeld
from udfserve.services.node.runtime_dir import RuntimeDirRefused
from udfserve.services.node.server_flags import check_server_command
from udfserve.services.node.supervisor import Supervisor
from udfserve.services.process_setup import configure_logging
from udfserve.services.settings_cli import settings_from_args

logger = logging.getLogger("udfserve.node")

EXIT_CONFIG_ERROR = 2
EXIT_LOCK_HELD = 3


def run_node(args: argparse.Namespace) -> int:
    """Run the node supervisor until SIGTERM; the exit code (0 after a clean stop)."""
    config = settings_from_args(NodeConfig, args)
    configure_logging(config.log_level, config.log_format)
    detection = detect_gpus()
    try:
        devices = plan_devices(config.devices, detection)
    except DeviceError as exc:
        logger.error("%s", exc)
        return EXIT_CONFIG_ERROR
    prometheus_client.disable_created_metrics()
    supervisor = Supervisor(config, devices, detection)
    for slot in supervisor.slots:
        try:
            check_server_command(slot.serve_arguments(config))
        except ValueError as exc:
            logger.error(
                "refusing to start: the model server on %s would refuse its settings: %s",
                slot.device.device,
                exc,
            )
            return EXIT_CONFIG_ERROR
    try:
        return asyncio.run(supervisor.run())
    except NodeLockHeld as exc:
        logger.error("refusing to start: %s", exc)
        return EXIT_LOCK_HELD
    except RuntimeDirRefused as exc:
        logger.error("refusing to start: %s", exc)
        return EXIT_CONFIG_ERROR
    except AdminAddressUnavailable as exc:
        logger.error("refusing to start: %s", exc)
        return EXIT_CONFIG_ERROR
