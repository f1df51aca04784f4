"""Which shared-memory files a server reads, and how: those of its own user and of the users it
trusts, by copy, so that a file its client truncates or fills fails that request only."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from udfserve.protocol import inference_pb2 as pb
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.frontends.arrow.shared_memory import (
    IOV_MAX,
    SharedMemoryRefused,
    StreamRegions,
)

ANOTHER_SERVER_UID = 4242
"""The uid the server under test takes itself for: the test's files then belong to someone else."""
FILE_BYTES = 1 << 20


@pytest.fixture
def payload(tmp_path: Path) -> pb.SharedMemoryRegion:
    path = tmp_path / f"udfserve-{secrets.token_hex(8)}.shm"
    path.write_bytes(b"\1" * FILE_BYTES)
    return pb.SharedMemoryRegion(path=str(path), offset=0, size=16)


@pytest.fixture
def regions(tmp_path: Path) -> Iterator[StreamRegions]:
    made = StreamRegions(tmp_path.resolve())
    yield made
    made.close()


@pytest.fixture
def server_of_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: ANOTHER_SERVER_UID)


def client_handle(region: pb.SharedMemoryRegion) -> int:
    """The client's descriptor of the file, opened before the server takes the name away."""
    return os.open(region.path, os.O_RDWR)


def test_a_file_of_another_user_is_refused_naming_both_users(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    with pytest.raises(SharedMemoryRefused) as refused:
        StreamRegions(tmp_path.resolve()).read(payload, "input_region")
    assert f"uid {ANOTHER_SERVER_UID}" in str(refused.value) and f"uid {os.getuid()}" in str(refused.value)
    assert Path(payload.path).exists()


def test_a_file_of_a_trusted_user_is_read_and_its_name_removed(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    regions = StreamRegions(tmp_path.resolve(), other_uids=frozenset({os.getuid()}))
    assert regions.read(payload, "input_region").to_pybytes() == b"\1" * 16
    assert not Path(payload.path).exists()
    regions.close()


def test_a_refusal_with_trusted_users_names_them(
    tmp_path: Path, payload: pb.SharedMemoryRegion, server_of_another_user: None
) -> None:
    regions = StreamRegions(tmp_path.resolve(), other_uids=frozenset({185}))
    with pytest.raises(SharedMemoryRefused, match=r"--shared-memory-uids \[185\]"):
        regions.read(payload, "input_region")


def test_a_read_region_keeps_the_files_alignment_and_is_writable(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    payload.offset, payload.size = 64 * 10 + 24, 4096
    read = regions.read(payload, "input_region")
    assert read.address % 64 == 24 and read.size == 4096 and read.is_mutable


def test_bytes_read_stay_intact_when_the_client_truncates_its_file_afterwards(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    descriptor = client_handle(payload)
    payload.size = FILE_BYTES
    read = regions.read(payload, "input_region")
    os.ftruncate(descriptor, 0)
    os.close(descriptor)
    # In a child: were these bytes still the client's file, touching them would be a SIGBUS.
    child = os.fork()
    if child == 0:
        os._exit(0 if np.frombuffer(read, np.uint8).sum() == FILE_BYTES else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (
        f"signal {signal.Signals(-os.waitstatus_to_exitcode(status))!r}"
    )


def test_a_region_of_a_file_truncated_since_it_was_opened_is_invalid_input_naming_both_sizes(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    descriptor = client_handle(payload)
    regions.read(payload, "input_region")
    os.ftruncate(descriptor, 4096)
    os.close(descriptor)
    payload.size = 16 << 10
    with pytest.raises(InvalidInput) as refused:
        regions.read(payload, "PredictRequest.input_region")
    message = str(refused.value)
    assert "PredictRequest.input_region names bytes 0..16384" in message
    assert f"holds 4096 bytes now, {FILE_BYTES} when this stream opened it" in message


def test_a_request_region_larger_than_the_limit_is_invalid_input_naming_the_limit(
    tmp_path: Path, payload: pb.SharedMemoryRegion
) -> None:
    regions = StreamRegions(tmp_path.resolve(), max_region_bytes=1 << 16)
    payload.size = (1 << 16) + 1
    with pytest.raises(InvalidInput, match=r"names 65537 bytes .* expected at most 65536"):
        regions.read(payload, "input_region")
    regions.close()


def test_an_answer_is_written_into_its_region_of_the_file(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    answer = pa.record_batch({"y": pa.array(np.arange(100, dtype=np.float32))})
    assert written_back(regions, payload, answer).equals(answer)


def test_an_answer_of_more_buffers_than_one_write_call_takes_is_written_whole(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    columns = IOV_MAX  # each column is several pieces of the stream (metadata, buffers, padding)
    answer = pa.record_batch({f"y{index}": pa.array([index, None], pa.int32()) for index in range(columns)})
    assert written_back(regions, payload, answer).equals(answer)


def written_back(
    regions: StreamRegions, payload: pb.SharedMemoryRegion, answer: pa.RecordBatch
) -> pa.RecordBatch:
    """``answer`` written into the second half of ``payload``'s file, as the client reads it back."""
    descriptor = client_handle(payload)
    room = pb.SharedMemoryRegion(path=payload.path, offset=1 << 19, size=1 << 19)
    regions.read(payload, "input_region")
    written = regions.write(room, "output_region", answer)
    assert written is not None
    on_file = os.pread(descriptor, written, room.offset)
    os.close(descriptor)
    return pa.ipc.open_stream(on_file).read_next_batch()


def test_an_answer_too_large_for_its_region_is_not_written(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    descriptor = client_handle(payload)
    answer = pa.record_batch({"y": pa.array(np.arange(1000, dtype=np.float32))})
    room = pb.SharedMemoryRegion(path=payload.path, offset=1 << 19, size=256)
    assert regions.write(room, "output_region", answer) is None
    untouched = os.pread(descriptor, FILE_BYTES, 0)
    os.close(descriptor)
    assert untouched == b"\1" * FILE_BYTES


def test_an_answer_to_a_file_truncated_below_its_region_is_invalid_input_naming_the_size(
    regions: StreamRegions, payload: pb.SharedMemoryRegion
) -> None:
    descriptor = client_handle(payload)
    regions.read(payload, "input_region")
    os.ftruncate(descriptor, 4096)
    os.close(descriptor)
    room = pb.SharedMemoryRegion(path=payload.path, offset=1 << 19, size=1 << 19)
    with pytest.raises(
        InvalidInput, match=r"output_region names bytes 524288..1048576 .* holds 4096 bytes now"
    ):
        regions.write(room, "output_region", pa.record_batch({"y": pa.array([1.0])}))
