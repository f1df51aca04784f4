"""No production module is over 400 lines: a module that long holds more than one job, and is
split by job into modules of one job each (docs/architecture.md). Production modules are those
of the three installed folders, ``udfserve/``, ``services/`` and ``spark_client/``; the protocol
code that ``scripts/generate_protos.py`` writes (``*_pb2.py``, ``*_pb2_grpc.py``) is generated,
not read, and is left out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("udfserve", "services", "spark_client")
MAX_LINES = 400
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")


def production_modules() -> list[Path]:
    """Every Python module of the installed folders, generated protocol code left out."""
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts and not GENERATED.search(path.name)
    ]


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_production_module_is_over_400_lines() -> None:
    over = {
        str(path.relative_to(ROOT)): lines
        for path in production_modules()
        if (lines := line_count(path)) > MAX_LINES
    }
    assert over == {}, (
        f"expected every production module to have at most {MAX_LINES} lines; split these by job, "
        f"one job a module: {over}"
    )


def test_the_check_reads_every_installed_folder() -> None:
    folders = {path.relative_to(ROOT).parts[0] for path in production_modules()}
    assert folders == set(PACKAGES)


def test_only_the_generated_protocol_code_is_left_out() -> None:
    read = set(production_modules())
    left_out = sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts and path not in read
    )
    assert left_out, "expected the generated protocol modules to be found and left out"
    assert all(name.startswith("udfserve/protocol/") for name in left_out), left_out
