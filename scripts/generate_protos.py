"""Regenerate the Python code of the wire contract from ``protos/``.

The ``.proto`` files are the source of truth; the generated modules are checked in
so that installing the client needs no compiler. ``tests/unit/test_generated_protos.py``
fails when they are stale. Run with the development environment's interpreter (grpcio-tools is
a development extra): ``.venv/bin/python scripts/generate_protos.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto under ``protos/`` into ``out_dir``; return the files written."""
    from grpc_tools import protoc  # only needed by developers, never at run time

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the checked-in files differ from fresh output"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        stale = []
        for fresh in generate(tmp_dir):
            target = ROOT / fresh.relative_to(tmp_dir)
            if not target.exists() or target.read_bytes() != fresh.read_bytes():
                stale.append(target)
                if not options.check:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(fresh.read_bytes())
    if options.check and stale:
        sys.stderr.write("stale generated files: " + ", ".join(map(str, stale)) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
