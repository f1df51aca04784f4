"""The client's half of ``udfserve_client_fallback_rows_total``: a task whose rows the CPU
fallback answered on a node with a supervisor adds them to this process's report in the node's
fallback reports folder (``udfserve.fallback_reports``), which the supervisor exports.

Only a live discovery file that passes the trust rule (``node_files``) is believed to name the
folder, and the folder is checked before a file is written in it. Reporting never fails a task: a
node without the folder, a folder that is not the node's, a full disk are logged and skipped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from udfserve.discovery import DiscoveryError, read_live_discovery
from udfserve.fallback_reports import add_fallback_rows, check_reports_folder, report_path
from udfserve.node_files import UntrustedNodeFile, trusted_uids
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.nodes.routing import ADDRESS_ENV, discovery_path

logger = logging.getLogger(__name__)

_TOKENS: dict[int, str] = {}
"""One report file per process (by pid: a forked worker starts one of its own)."""


def report_fallback_rows(
    config: TaskConfig, environ: Mapping[str, str], application: str, model: str, rows: int
) -> Path | None:
    """Add ``rows`` the fallback answered for ``model`` to this process's report on the node; the
    report's path, or None when the node takes no report (no node, an untrusted or old one)."""
    if rows <= 0 or not application or config.address or environ.get(ADDRESS_ENV):
        return None  # a configured address is not this node's supervisor
    trusted = trusted_uids(config.trusted_node_uids)
    try:
        discovery = read_live_discovery(discovery_path(config, environ), trusted=trusted)
    except DiscoveryError as exc:
        logger.debug("udfserve: fallback rows not reported to the node: %s", exc)
        return None
    if not discovery.fallback_reports_dir:
        return None
    folder = Path(discovery.fallback_reports_dir)
    try:
        check_reports_folder(folder, trusted)
        path = report_path(folder, os.geteuid(), os.getpid(), _TOKENS)
        add_fallback_rows(path, application, model, rows)
    except (UntrustedNodeFile, OSError) as exc:
        logger.warning(
            "udfserve: cannot report %d fallback rows of %s to node %s: %s",
            rows,
            model,
            discovery.node or "?",
            exc,
        )
        return None
    return path
