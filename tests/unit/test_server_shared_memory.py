"""Which shared-memory files a server maps: those of its own user and of the users it trusts."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from services.model_server.frontends.arrow.shared_memory import SharedMemoryRefused, StreamRegions
from udfserve.protocol import inference_pb2 as pb

ANOTHER_SERVER_UID = 4242
"""The uid the server under test takes itself for: the test's files then belong to someone else."""


@pytest.fixture
def payload(tmp_path: Path) -> pb.SharedMemoryRegion:
    path = tmp_path / f"udfserve-{secrets.token_hex(8)}.shm"
    path.write_bytes(b"\1" * 4096)
    return pb.SharedMemoryRegion(path=str(path), offset=0, size=16)


@pytest.fixture
def server_of_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: ANOTHER_SERVER_UID)


def test_a_file_of_another_user_is_refused_naming_both_users(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    with pytest.raises(SharedMemoryRefused) as refused:
        StreamRegions(tmp_path.resolve()).bytes_of(payload, "input_region")
    assert f"uid {ANOTHER_SERVER_UID}" in str(refused.value) and f"uid {os.getuid()}" in str(refused.value)
    assert Path(payload.path).exists()


def test_a_file_of_a_trusted_user_is_mapped_and_its_name_removed(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    regions = StreamRegions(tmp_path.resolve(), other_uids=frozenset({os.getuid()}))
    assert regions.bytes_of(payload, "input_region").to_pybytes() == b"\1" * 16
    assert not Path(payload.path).exists()
    regions.close()


def test_a_refusal_with_trusted_users_names_them(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    regions = StreamRegions(tmp_path.resolve(), other_uids=frozenset({185}))
    with pytest.raises(SharedMemoryRefused, match=r"--shared-memory-uids \[185\]"):
        regions.bytes_of(payload, "input_region")
