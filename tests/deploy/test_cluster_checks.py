"""deploy/cluster/checks.py, which judges the container cluster's runs, on evidence laid out as a run
writes it: a claim holds only when the figures say so, and a node that answered another node's rows,
or an id written twice, fails the claim it breaks, naming the figures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cluster_files import CLUSTER_DIR

APP = "app-20261127230409-0000"


def checks_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_checks", CLUSTER_DIR / "checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CHECKS = checks_module()


def task(partition: int, host: str, status: str = "SUCCESS") -> dict[str, Any]:
    launched = f"2026-11-27T23:04:{10 + partition:02d}.000GMT"
    return {"stage": 0, "partition": partition, "attempt": 0, "host": host, "executor": host[-1],
            "status": status, "launched": launched, "error": ""}  # fmt: skip


def node(host: str, rows: int) -> dict[str, Any]:
    server = {"device": "cpu", "pid": 17, "state": "ready", "app_rows": {APP: rows}, "ready_versions": [1]}
    return {"host": host, "node": host, "servers": [server], "server_restarts": 0}


def write_routing_run(folder: Path, served: dict[str, int], ids_missing: int = 0) -> None:
    """Job a of 300 rows, 100 per node over three partitions; each node's servers answered ``served``."""
    hosts = ["node1", "node2", "node3"]
    job = {
        "name": "a", "app_id": APP, "rows": 300, "partitions": 3, "seconds": 10.0,
        "stats": {"rows_by_server": 300, "rows_by_fallback": 0, "fallback_reasons": {}},
        "tasks": [task(p, h) for p, h in enumerate(hosts)], "executors": [],
    }  # fmt: skip
    output = {
        "success_marker": True, "files": 3, "rows": 300 - ids_missing, "distinct_ids": 300 - ids_missing,
        "ids_twice_or_more": 0, "ids_missing": ids_missing, "ids_outside_range": 0, "null_predictions": 0,
        "rows_by_host": dict.fromkeys(hosts, 100),
        "partition_hosts": {str(p): [h] for p, h in enumerate(hosts)},
    }  # fmt: skip
    (folder / "job.json").write_text(json.dumps(job))
    (folder / "output.json").write_text(json.dumps(output))
    for host, rows in served.items():
        (folder / f"node-{host}.json").write_text(json.dumps(node(host, rows)))


def claims(check: str, folder: Path) -> dict[str, bool]:
    verdicts = CHECKS.Verdicts()
    CHECKS.CHECKS[check](folder, verdicts)
    return {
        line.split(" ", 1)[1]: line.startswith("HELD")
        for line in verdicts.lines
        if line.startswith(("HELD", "FAILED"))
    }


def test_routing_holds_when_every_node_answered_exactly_its_own_rows(tmp_path: Path) -> None:
    write_routing_run(tmp_path, {"node1": 100, "node2": 100, "node3": 100})
    judged = claims("routing", tmp_path)
    assert judged and all(judged.values()), judged


def test_a_node_answering_another_nodes_rows_fails_the_crossing_claim(tmp_path: Path) -> None:
    write_routing_run(tmp_path, {"node1": 150, "node2": 50, "node3": 100})
    judged = claims("routing", tmp_path)
    [crossed] = [claim for claim in judged if claim.startswith("0 rows crossed nodes")]
    assert not judged[crossed] and "50 rows answered by a node's servers beyond" in crossed
    assert not next(held for claim, held in judged.items() if claim.startswith("each node's servers"))


def test_a_missing_id_fails_exactly_once(tmp_path: Path) -> None:
    write_routing_run(tmp_path, {"node1": 100, "node2": 100, "node3": 100}, ids_missing=1)
    judged = claims("routing", tmp_path)
    [once] = [
        claim for claim in judged if claim.startswith("the committed output holds every id exactly once")
    ]
    assert not judged[once] and "1 missing" in once


@pytest.mark.parametrize("missing", ["job.json", "output.json"])
def test_a_run_without_its_evidence_fails_instead_of_passing(tmp_path: Path, missing: str) -> None:
    write_routing_run(tmp_path, {"node1": 100, "node2": 100, "node3": 100})
    (tmp_path / missing).unlink()
    judged = claims("routing", tmp_path)
    assert judged and not any(judged.values())
