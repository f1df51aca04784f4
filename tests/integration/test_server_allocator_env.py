"""A launched model server process runs with glibc keeping freed memory (read from the kernel)."""

from __future__ import annotations

from pathlib import Path

from udfserve.services.model_server.launcher import ALLOCATOR_ENV, ServerProcess, server_env


def test_the_server_process_runs_with_the_allocator_settings(server: ServerProcess) -> None:
    entries = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    environ = dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)
    expected = server_env()  # ALLOCATOR_ENV, unless the test's own environment sets these
    assert {name: environ.get(name) for name in ALLOCATOR_ENV} == {
        name: expected.get(name) for name in ALLOCATOR_ENV
    }
