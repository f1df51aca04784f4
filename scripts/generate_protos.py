"""Regenerate the Python code of the wire contract from ``protos/``.

The ``.proto`` files are the source of truth; the generated modules are checked in
so that installing the client needs no compiler. ``tests/unit/test_generated_protos.py``
fails when they are stale. Run with the development environment's interpreter (grpcio-tools is
a development extra): ``.venv/bin/python scripts/generate_protos.py``.

udfserve's own protocol is compiled from ``protos/`` as its root, so a file's name in the
descriptor pool is its path (``udfserve/protocol/v1/inference.proto``). The KServe v2 (Triton)
protocol, ``protos/udfserve/protocol/kserve/`` (NVIDIA's files, unchanged), is compiled from its
own folder: its files must keep the bare names NVIDIA gives them (``grpc_service.proto``,
``model_config.proto``), because tritonclient's modules register the same files in the same
process and the descriptor pool accepts a file twice only when both copies are byte for byte the
same. protoc then writes their imports of each other as top-level modules; they are rewritten to
the package they are checked in as.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


@dataclass(frozen=True)
class ForeignProtocol:
    """Protos compiled from their own folder, their generated code checked in as ``package``."""

    folder: Path
    package: str

    @property
    def output(self) -> Path:
        return Path(*self.package.split("."))


FOREIGN_PROTOCOLS = (
    # github.com/triton-inference-server/common, protobuf/ at a4ff44d5b34de99705088b6756b594ba59448975
    # (the files of the r26.05 to r26.07 branches too): the descriptors of tritonclient 2.73.0.
    ForeignProtocol(PROTO_ROOT / "udfserve" / "protocol" / "kserve", "udfserve.protocol.kserve"),
)


def _protoc(include: Path, out_dir: Path, protos: list[Path]) -> None:
    from grpc_tools import protoc  # only needed by developers, never at run time

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")


def _own_protos() -> list[Path]:
    foreign = [protocol.folder for protocol in FOREIGN_PROTOCOLS]
    return sorted(
        p for p in PROTO_ROOT.rglob("*.proto") if not any(p.is_relative_to(folder) for folder in foreign)
    )


def _package_imports(generated: Path, modules: set[str], package: str) -> None:
    """``import model_config_pb2 as x`` -> ``from <package> import model_config_pb2 as x``."""
    pattern = re.compile(rf"^import ({'|'.join(map(re.escape, sorted(modules)))}) as ", re.MULTILINE)
    text = generated.read_text()
    generated.write_text(pattern.sub(rf"from {package} import \1 as ", text))


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto under ``protos/`` into ``out_dir``; return the files written."""
    _protoc(PROTO_ROOT, out_dir, _own_protos())
    for protocol in FOREIGN_PROTOCOLS:
        target = out_dir / protocol.output
        protos = sorted(protocol.folder.glob("*.proto"))
        _protoc(protocol.folder, target, protos)
        modules = {p.stem + "_pb2" for p in protos}
        for generated in target.iterdir():
            if generated.name.endswith(GENERATED_SUFFIXES):
                _package_imports(generated, modules, protocol.package)
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
