"""The doctor's pure pieces: its settings, how it reads a lock from the kernel, how it prints."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from udfserve.services.doctor.config import DoctorConfig
from udfserve.services.doctor.host_checks import check_shared_memory, file_system_type
from udfserve.services.doctor.node_checks import flock_holders, lock_taken
from udfserve.services.doctor.render import render_json, render_text
from udfserve.services.doctor.report import Finding, Report


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Path]:
    """A file this process holds an exclusive flock on, as a supervisor holds node.lock."""
    path = tmp_path / "node.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield path
    finally:
        os.close(descriptor)


def test_the_discovery_file_is_looked_for_where_the_node_writes_it(tmp_path: Path) -> None:
    assert DoctorConfig(runtime_dir=tmp_path).discovery_path == tmp_path / "discovery.json"
    named = tmp_path / "elsewhere.json"
    config = DoctorConfig(runtime_dir=tmp_path, discovery_file=named)
    assert config.discovery_path == named and config.runtime_folder == tmp_path
    assert DoctorConfig(discovery_file=named).runtime_folder == tmp_path


def test_the_settings_are_read_from_the_variables_the_node_and_the_client_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("UDFSERVE_AUTH_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("UDFSERVE_TRUSTED_NODE_UIDS", "10001, 10002")
    config = DoctorConfig()
    assert config.discovery_path == tmp_path / "discovery.json"
    assert config.auth_token_file == tmp_path / "token" and config.trusted_node_uids == (10001, 10002)


def test_shared_memory_off_is_described_not_checked() -> None:
    config = DoctorConfig(shared_memory_dir="off")  # type: ignore[arg-type]
    assert config.shared_memory_dir is None
    [finding] = check_shared_memory(config)
    assert finding.status == "info" and finding.summary.startswith("off (--shared-memory-dir off)")


def test_a_token_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="give auth_token or auth_token_file, not both"):
        DoctorConfig(auth_token="a", auth_token_file=Path("/t"))  # type: ignore[arg-type]


def test_the_kernels_lock_table_names_this_process_as_the_holder(held_lock: Path) -> None:
    found = held_lock.stat()
    holders = flock_holders(os.major(found.st_dev), os.minor(found.st_dev), found.st_ino)
    assert holders == (os.getpid(),)


def test_a_held_lock_is_taken_and_a_free_one_is_not_and_stays_free(held_lock: Path, tmp_path: Path) -> None:
    assert lock_taken(held_lock) is True
    free = tmp_path / "free.lock"
    free.touch()
    assert lock_taken(free) is False
    descriptor = os.open(free, os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the try let it go at once
    finally:
        os.close(descriptor)
    assert lock_taken(tmp_path / "absent.lock") is None


def test_the_file_system_of_a_folder_is_read_from_the_mount_table() -> None:
    assert file_system_type(Path("/proc/self")) == "proc"


def report(*statuses: str) -> Report:
    return Report(
        findings=[
            Finding.model_validate(
                {"group": "servers", "name": f"sim:{i}", "status": s, "summary": "x " * 80, "fix": "do it"}
            )
            for i, s in enumerate(statuses)
        ]
    )


def test_a_failed_finding_blocks_jobs_and_sets_exit_code_1() -> None:
    assert report("ok", "warn").exit_code == 0
    blocked = report("ok", "fail", "fail")
    assert blocked.exit_code == 1 and not blocked.healthy
    assert render_text(blocked).endswith(
        "Not healthy: 2 problems block jobs (sim:1, sim:2); 0 warnings. Exit code 1.\n"
    )
    assert render_text(report("fail")).endswith(
        "Not healthy: 1 problem blocks jobs (sim:0); 0 warnings. Exit code 1.\n"
    )


def test_the_text_wraps_each_finding_under_its_mark_with_its_fix_below() -> None:
    text = render_text(report("warn"))
    lines = text.splitlines()
    start = lines.index("Servers") + 1
    assert lines[start].startswith("  WARN  sim:0: x x")
    assert all(len(line) <= 100 for line in lines[1:])
    assert any(line == "        fix: do it" for line in lines)


def test_the_json_report_carries_the_verdict_and_the_counts() -> None:
    loaded = Report.model_validate_json(render_json(report("ok", "fail")))
    assert loaded.findings[1].status == "fail"
    as_dict = report("ok", "fail").model_dump()
    assert as_dict["healthy"] is False and as_dict["counts"] == {"ok": 1, "info": 0, "warn": 0, "fail": 1}
