"""The node refuses a runtime folder that another user made or may write, and makes its own private.

The other user is real: ``nobody``, running the system's Python, creates the folder the node is
then pointed at, as a local attacker would before a node starts. Root runs the suite; elsewhere
these tests are skipped (switching users needs root).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_harness import NodeProcess, node_command

from udfserve.services.node.config import NodeConfig
from udfserve.services.node.runtime_dir import PRIVATE_MODE, prepare_runtime_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")

OTHER_USER = "nobody"
SYSTEM_PYTHON = "/usr/bin/python3"


def as_other_user(code: str) -> None:
    """Run ``code`` in the system's Python as ``nobody`` (the project's environment may not be
    readable by that user, and the attacker needs only the standard library)."""
    subprocess.run([SYSTEM_PYTHON, "-c", code], user=OTHER_USER, check=True, timeout=60)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user may create entries in, with the sticky bit: another ``/tmp``."""
    path = Path(tempfile.mkdtemp(prefix="udfn-trust-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_refused(runtime_dir: Path, repository: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        node_command(runtime_dir, repository, "sim:0"), capture_output=True, text=True, timeout=120
    )


def test_the_node_refuses_a_runtime_folder_another_user_created_first(
    shared_tmp: Path, tabular_onnx_repository: Path
) -> None:
    runtime_dir = shared_tmp / "rt"
    as_other_user(f"import os; os.mkdir({str(runtime_dir)!r}, 0o755)")

    refused = start_refused(runtime_dir, tabular_onnx_repository)

    assert refused.returncode == 2, refused.stderr
    assert f"refusing to start: the runtime folder ({runtime_dir}) belongs to uid 65534 (nobody)" in (
        refused.stderr
    )
    assert f"chown {os.geteuid()} {runtime_dir}" in refused.stderr
    assert list(runtime_dir.iterdir()) == []  # no lock, socket or discovery file went into it


def test_the_node_refuses_a_runtime_folder_that_others_may_write(
    shared_tmp: Path, tabular_onnx_repository: Path
) -> None:
    runtime_dir = shared_tmp / "rt"
    runtime_dir.mkdir()
    runtime_dir.chmod(0o777)

    refused = start_refused(runtime_dir, tabular_onnx_repository)

    assert refused.returncode == 2, refused.stderr
    assert f"the runtime folder ({runtime_dir}) has mode 0777: writable by other users" in refused.stderr
    assert list(runtime_dir.iterdir()) == []


def test_the_node_refuses_a_discovery_file_folder_another_user_owns(
    shared_tmp: Path, tabular_onnx_repository: Path
) -> None:
    elsewhere = shared_tmp / "discovery"
    as_other_user(f"import os; os.mkdir({str(elsewhere)!r}, 0o755)")
    command = node_command(shared_tmp / "rt", tabular_onnx_repository, "sim:0")

    refused = subprocess.run(
        [*command, "--discovery-file", str(elsewhere / "discovery.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert refused.returncode == 2, refused.stderr
    assert f"the discovery file's folder ({elsewhere}) belongs to uid 65534 (nobody)" in refused.stderr


def test_a_runtime_folder_the_node_creates_is_its_own_and_writable_by_no_one_else(
    two_device_node: NodeProcess,
) -> None:
    found = two_device_node.runtime_dir.stat()
    assert found.st_uid == os.geteuid()
    assert stat.S_IMODE(found.st_mode) & 0o022 == 0


def test_the_default_runtime_folder_is_created_private(tmp_path: Path, tabular_onnx_repository: Path) -> None:
    """Only its user's executors use the default folder: 0700 (the node creates it so; here the same
    function on a folder of the test's)."""
    config = NodeConfig(model_repository=tabular_onnx_repository)
    assert config.runtime_dir == Path(f"/tmp/udfserve-{os.geteuid()}")
    assert config.runtime_dir_mode == PRIVATE_MODE
    prepare_runtime_dir(tmp_path / "private", config.runtime_dir_mode)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700
