"""Another process's resident memory, as the kernel counts it (``/proc/<pid>/status``)."""

from __future__ import annotations

from pathlib import Path

MIB = 1 << 20


def status_bytes(pid: int, field: str) -> int:
    """A memory field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def resident_bytes(pid: int) -> int:
    return status_bytes(pid, "VmRSS")


class PeakMemory:
    """The growth of a process's peak resident memory over a block: the peak is reset at start
    (``/proc/<pid>/clear_refs``), so the peak read at the end is the block's own."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        self.start_bytes = resident_bytes(pid)

    def growth_bytes(self) -> int:
        return status_bytes(self._pid, "VmHWM") - self.start_bytes
