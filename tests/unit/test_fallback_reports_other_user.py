"""A real second local user (``nobody``, running the system's Python) and a shared node's fallback
reports folder (1733): their report is counted, labelled ``owner="other"``; they can neither replace
the node user's report nor have theirs pass for it. Root runs the suite; elsewhere these tests are
skipped (switching users needs root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from udfserve.fallback_reports import add_fallback_rows, report_path
from udfserve.services.node.fallback_metrics import FallbackRows, prepare_reports_folder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")

OTHER_USER = "nobody"
OTHER_UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
APP = "app-20261128-0001"


def as_other_user(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in the system's Python as ``nobody`` (the attacker needs only the standard library)."""
    return subprocess.run(
        [SYSTEM_PYTHON, "-c", code], user=OTHER_USER, capture_output=True, text=True, check=False, timeout=60
    )


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A shared node's reports folder, in a folder every user may traverse."""
    root = Path(tempfile.mkdtemp(prefix="udfn-reports-"))
    root.chmod(0o755)
    folder = root / "fallback-reports"
    prepare_reports_folder(folder, shared=True)
    yield folder
    shutil.rmtree(root, ignore_errors=True)


def exported(collector: FallbackRows) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (s.labels["model"], s.labels["application"], s.labels["owner"]): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "udfserve_client_fallback_rows_total"
    }


def test_another_users_report_is_counted_under_owner_other(shared_folder: Path) -> None:
    document = json.dumps({"application": APP, "rows": {"tabular_mlp": 700}})
    written = as_other_user(
        f"open({str(shared_folder / f'{OTHER_UID}-00000000000000aa.json')!r}, 'w').write({document!r})"
    )

    assert written.returncode == 0, written.stderr
    assert exported(FallbackRows(shared_folder)) == {("tabular_mlp", APP, "other"): 700}


def test_another_user_cannot_replace_the_node_users_report(shared_folder: Path) -> None:
    ours = report_path(shared_folder, os.geteuid(), os.getpid(), {})
    add_fallback_rows(ours, APP, "tabular_mlp", 100)
    forged = json.dumps({"application": APP, "rows": {"tabular_mlp": 10**9}})
    code = (
        "import os\n"
        f"open({str(shared_folder / '.forged')!r}, 'w').write({forged!r})\n"
        f"os.replace({str(shared_folder / '.forged')!r}, {str(ours)!r})\n"
    )

    replaced = as_other_user(code)

    assert replaced.returncode != 0 and "PermissionError" in replaced.stderr
    assert exported(FallbackRows(shared_folder)) == {("tabular_mlp", APP, "node"): 100}


def test_another_user_cannot_list_the_reports(shared_folder: Path) -> None:
    add_fallback_rows(report_path(shared_folder, os.geteuid(), os.getpid(), {}), APP, "tabular_mlp", 1)

    listed = as_other_user(f"import os; print(os.listdir({str(shared_folder)!r}))")

    assert listed.returncode != 0 and "PermissionError" in listed.stderr


def test_a_report_of_another_user_named_for_the_node_user_is_removed_uncounted(shared_folder: Path) -> None:
    document = json.dumps({"application": APP, "rows": {"tabular_mlp": 5}})
    name = f"{os.geteuid()}-00000000000000bb.json"
    written = as_other_user(f"open({str(shared_folder / name)!r}, 'w').write({document!r})")

    assert written.returncode == 0, written.stderr
    assert exported(FallbackRows(shared_folder)) == {}
    assert not (shared_folder / name).exists()
