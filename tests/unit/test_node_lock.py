"""The node lock: one supervisor per runtime folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from udfserve.services.node.lock import NodeLock, NodeLockHeld


def test_a_second_lock_on_the_same_file_is_refused_naming_the_file_and_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    with NodeLock(path), pytest.raises(NodeLockHeld) as refused:
        NodeLock(path).acquire()

    assert f"pid {os.getpid()}" in str(refused.value)
    assert str(path) in str(refused.value)


def test_the_lock_can_be_taken_again_once_released(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    with NodeLock(path):
        pass

    with NodeLock(path):
        assert path.read_text() == f"{os.getpid()}\n"
    assert path.read_text() == ""


def test_locks_on_different_runtime_folders_do_not_conflict(tmp_path: Path) -> None:
    with NodeLock(tmp_path / "a" / "node.lock"), NodeLock(tmp_path / "b" / "node.lock"):
        assert (tmp_path / "b" / "node.lock").exists()
