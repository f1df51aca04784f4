"""The table of KServe system shared-memory regions (``SystemSharedMemory``) over real files in a
folder of its own: the server-wide bounds, the files it refuses, and reads and writes by copy.
The protocol around it is tested against a real server in
``tests/integration/test_kserve_shared_memory.py``."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from udfserve.runtime.errors import ServingError
from udfserve.services.model_server.frontends.kserve.system_shared_memory import (
    RegionBounds,
    SystemSharedMemory,
    client_of,
)


def table(folder: Path, **bounds: int) -> SystemSharedMemory:
    return SystemSharedMemory(folder.resolve(), RegionBounds(**bounds))


def shm_file(folder: Path, name: str, size: int) -> str:
    (folder / name).write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return f"/{name}"


def refused(call: object) -> ServingError:
    with pytest.raises(ServingError) as raised:
        call()  # type: ignore[operator]
    return raised.value


def test_the_servers_bound_on_regions_holds_across_clients(tmp_path: Path) -> None:
    regions = table(tmp_path, max_regions=2)
    regions.register("a", shm_file(tmp_path, "a", 64), 0, 64, "ipv4:10.0.0.1")
    regions.register("b", shm_file(tmp_path, "b", 64), 0, 64, "ipv4:10.0.0.2")
    error = refused(lambda: regions.register("c", shm_file(tmp_path, "c", 64), 0, 64, "ipv4:10.0.0.3"))
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server's bound of 2 regions (--kserve-shared-memory-max-regions)" in error.message


def test_the_servers_bound_on_registered_bytes_holds_across_clients(tmp_path: Path) -> None:
    regions = table(tmp_path, max_bytes=100)
    regions.register("a", shm_file(tmp_path, "a", 64), 0, 64, "ipv4:10.0.0.1")
    error = refused(lambda: regions.register("b", shm_file(tmp_path, "b", 64), 0, 64, "ipv4:10.0.0.2"))
    assert (
        error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and "--kserve-shared-memory-max-bytes" in error.message
    )


def test_an_unregistered_region_gives_its_room_back(tmp_path: Path) -> None:
    regions = table(tmp_path, max_regions=1)
    key = shm_file(tmp_path, "a", 64)
    regions.register("a", key, 0, 64, "ipv4:10.0.0.1")
    regions.unregister("a")
    regions.register("a", key, 0, 64, "ipv4:10.0.0.1")
    assert [region.name for region in regions.status("")] == ["a"]


def test_a_name_registered_already_is_already_exists(tmp_path: Path) -> None:
    regions = table(tmp_path)
    key = shm_file(tmp_path, "a", 64)
    regions.register("a", key, 0, 64, "ipv4:10.0.0.1")
    assert (
        refused(lambda: regions.register("a", key, 0, 64, "ipv4:10.0.0.1")).code
        == grpc.StatusCode.ALREADY_EXISTS
    )


def test_a_file_smaller_than_offset_and_size_is_refused_naming_both(tmp_path: Path) -> None:
    regions = table(tmp_path)
    error = refused(lambda: regions.register("a", shm_file(tmp_path, "a", 64), 32, 64, "c"))
    assert (
        error.code == grpc.StatusCode.INVALID_ARGUMENT
        and "holds 64 bytes; expected at least" in error.message
    )


def test_a_file_that_is_not_regular_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    error = refused(lambda: table(tmp_path).register("a", "/fifo", 0, 8, "c"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and "not a regular file" in error.message


def test_a_read_copies_the_range_at_the_regions_offset(tmp_path: Path) -> None:
    regions = table(tmp_path)
    regions.register("a", shm_file(tmp_path, "a", 512), 256, 256, "c")
    assert bytes(regions.read("a", 8, 4, "input 'x'")) == bytes([8, 9, 10, 11])


def test_a_write_beyond_the_size_the_client_gave_is_refused(tmp_path: Path) -> None:
    regions = table(tmp_path)
    regions.register("a", shm_file(tmp_path, "a", 64), 0, 64, "c")
    error = refused(lambda: regions.write("a", 0, 8, memoryview(bytes(16)), "output 'y'"))
    assert "output 'y' is 16 bytes" in error.message and "holds 8" in error.message


def test_a_write_into_a_file_that_shrank_is_refused_and_does_not_grow_it_back(tmp_path: Path) -> None:
    regions = table(tmp_path)
    regions.register("a", shm_file(tmp_path, "a", 64), 0, 64, "c")
    os.truncate(tmp_path / "a", 10)
    error = refused(lambda: regions.write("a", 0, 64, memoryview(bytes(32)), "output 'y'"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and "region 'a'" in error.message
    assert (tmp_path / "a").stat().st_size == 10


def test_a_client_is_its_address_without_the_port() -> None:
    assert client_of("ipv4:10.0.0.3:52011") == "ipv4:10.0.0.3"
    assert client_of("ipv6:[::1]:52011") == "ipv6:[::1]"
    assert client_of("ipv6:%5B::1%5D:52011") == "ipv6:[::1]"
    assert client_of("unix:/run/udfserve.sock") == "unix:/run/udfserve.sock"
