"""Where a Python process's resident memory goes, read from ``/proc/<pid>/smaps``.

Used by ``benchmarks.worker_memory`` from outside a Spark Python worker (sampled at its peak)
and from inside it (at the end of each partition). Imports nothing heavy at the top, so that
a worker importing it holds what it held before.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")
_PACKAGE = re.compile(r"/site-packages/([^/]+)/")
_LIBRARIES = ("grpc", "pyarrow", "pandas", "numpy", "pydantic", "pydantic_core", "pyspark", "psutil")
SHARED_MEMORY_DIRECTORIES = ("/dev/shm/",)


def category(path: str) -> str:
    """The library (or kind of mapping) a mapping of ``smaps`` belongs to."""
    if not path:
        return "anonymous"
    if path == "[heap]":
        return "heap (brk)"
    if path.startswith("["):
        return "other"
    if path.startswith(SHARED_MEMORY_DIRECTORIES):
        return "shared-memory files"
    found = _PACKAGE.search(path)
    if found:
        package = found.group(1)
        if package.endswith(".libs"):  # wheels' bundled libraries: numpy.libs, pyarrow.libs...
            package = package[: -len(".libs")]
        return package if package in _LIBRARIES else "other packages"
    if "libpython" in path or re.search(r"/python3[.\d]*$", path):
        return "python"
    return "other files"


def breakdown(pid: int | str = "self") -> dict[str, float]:
    """MiB resident per ``category``, with ``rss`` and ``anonymous pages`` (private pages of
    any mapping, file-backed ones' written data included) over all of them."""
    by_category: Counter[str] = Counter()
    anonymous_pages = 0
    current = "other"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            if line.startswith("Rss:"):
                by_category[current] += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anonymous_pages += int(line.split()[1])
            elif not line[:1].isupper():
                header = _HEADER.match(line)
                if header:
                    current = category(header.group(1).strip())
    mib = {name: kib / 1024 for name, kib in by_category.items()}
    mib["rss"] = sum(by_category.values()) / 1024
    mib["anonymous pages"] = anonymous_pages / 1024
    return mib


def status_mib(pid: int | str = "self") -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (the resident high-water mark) of ``/proc/<pid>/status``, in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def glibc_heap_mib() -> dict[str, float]:
    """glibc's own view of its heap: bytes in its arenas, in use there, free but kept, and in
    separate mmaps (``mallinfo2``); empty where the C library has none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "arenas": info.arena / 2**20,
        "in use": info.uordblks / 2**20,
        "free, kept": info.fordblks / 2**20,
        "mmapped": info.hblkhd / 2**20,
    }


def udfserve_files() -> dict[str, str]:
    """The real path (links followed) of each ``udfserve`` module this process imported: which
    checkout's client it ran (``benchmarks.client_trees``)."""
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "udfserve" or name.startswith("udfserve.")) and path:
            files[name] = os.path.realpath(path)
    return files


def worker_report() -> dict[str, Any]:
    """What a worker holds now, from inside it: smaps, its high-water mark, glibc's and
    pyarrow's allocators, the top-level packages it imported and where its ``udfserve`` came
    from."""
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "status": status_mib(),
        "smaps": breakdown(),
        "glibc": glibc_heap_mib(),
        "packages": sorted({name.partition(".")[0] for name in sys.modules}),
        "modules": len(sys.modules),
        "udfserve files": udfserve_files(),
    }
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pool = pa.default_memory_pool()
        report["pyarrow pool"] = {
            "backend": pool.backend_name,
            "allocated MiB": pool.bytes_allocated() / 2**20,
            "peak MiB": pool.max_memory() / 2**20,
        }
    return report


def reported(function: Callable[[Iterator[Any]], Iterator[Any]], report_dir: str) -> Any:
    """An iterator pandas UDF's ``function`` that writes ``worker_report`` to ``report_dir``
    once its partition ends (one JSON file per partition)."""
    import pandas as pd

    def run(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        yield from function(batches)
        report = worker_report()
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else -1
        target = Path(report_dir) / f"{os.getpid()}-{partition}.json"
        target.write_text(json.dumps(report))

    # Spark infers the iterator form from the hints, resolved here since pandas is imported here.
    run.__annotations__ = {"batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    return run
