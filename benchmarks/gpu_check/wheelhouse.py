"""The wheels the GPU machine lacks, fetched here beforehand, and put on its path there.

The GPU machine has Python 3.12 with PyTorch (CUDA), onnx, onnxruntime, nvidia-ml-py, grpcio,
pyarrow, pandas, prometheus-client and tokenizers, and no network. udfserve's base install and
its ``server`` extra need more (pydantic-settings, FastAPI, uvicorn, the gRPC health service,
...), and its generated gRPC code needs grpcio 1.75.1 or later and protobuf 6, which that machine
may not have. So:

    python -m benchmarks.gpu_check.wheelhouse build build/gpu-wheelhouse      # here, with a network
    python -m benchmarks.gpu_check.wheelhouse unpack build/gpu-wheelhouse build/gpu-check/site
    python -m benchmarks.gpu_check.wheelhouse check                           # there, before the run

``build`` resolves the base dependencies and the ``server`` extra of ``pyproject.toml`` for
CPython 3.12 on manylinux x86-64 (binary wheels only: pure ``py3-none-any`` wheels and cp312
manylinux ones), less what the machine brings (``MACHINE_PROVIDES``: TensorFlow is not used
there, torch's numpy and onnx's ml-dtypes are kept). ``unpack`` extracts every wheel into one
folder for ``PYTHONPATH`` (no pip, no network): a wheel is a zip of what ``site-packages``
receives. ``check`` names the modules still missing. Standard library only: it runs before the
packages it installs are there.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
MACHINE_PROVIDES = frozenset(
    {"tensorflow", "numpy", "ml-dtypes", "pyarrow", "nvidia-ml-py", "prometheus-client"}
)
"""Requirements left out: on the machine already (its numpy and ml-dtypes are torch's and onnx's
own), or not used there (TensorFlow: the check serves PyTorch and ONNX models)."""
CHECK_ONLY = ("psutil>=5.9",)
"""What the check itself needs beyond udfserve (the dev extra has it)."""
REQUIRED_MODULES = (
    "grpc",
    "grpc_health.v1",
    "google.protobuf",
    "pydantic",
    "pydantic_settings",
    "yaml",
    "fastapi",
    "uvicorn",
    "pythonjsonlogger",
    "psutil",
    "numpy",
    "pyarrow",
    "prometheus_client",
    "pynvml",
    "onnx",
    "onnxruntime",
    "udfserve.protocol.v1.inference_pb2_grpc",
    "udfserve.protocol.kserve.grpc_service_pb2_grpc",
)
"""What the run imports, udfserve's generated gRPC code last (it checks the grpcio version)."""


def distribution(requirement: str) -> str:
    """The normalised distribution name of a requirement or of a wheel file's name."""
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[str]:
    """The base dependencies and the ``server`` extra of pyproject.toml, less ``MACHINE_PROVIDES``."""
    import tomllib  # Python 3.11 and later: only where the wheelhouse is built

    project = tomllib.loads((REPOSITORY_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["server"], *CHECK_ONLY]
    return [r for r in wanted if distribution(r) not in MACHINE_PROVIDES]


def build(folder: Path, python_version: str = PYTHON_VERSION) -> int:
    """Download the wheels for CPython ``python_version`` into ``folder`` (emptied first);
    returns its size in bytes."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(folder),
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            *platforms,
            *requirements(),
        ],
        check=True,
    )
    for wheel in folder.glob("*.whl"):
        if distribution(wheel.name.split("-", 1)[0]) in MACHINE_PROVIDES:
            wheel.unlink()
    return sum(wheel.stat().st_size for wheel in folder.glob("*.whl"))


def foreign_wheels(wheels: Sequence[Path]) -> list[str]:
    """The wheels this interpreter cannot load: built for another CPython than this one (a
    ``cp312`` wheel needs 3.12; an ``abi3`` one, that version or later)."""
    here = sys.version_info.minor
    foreign = []
    for wheel in wheels:
        python_tag, abi_tag = wheel.stem.split("-")[-3:-1]
        versions = [int(tag[3:]) for tag in python_tag.split(".") if tag.startswith("cp3")]
        if versions and not any(v == here or (abi_tag == "abi3" and v <= here) for v in versions):
            foreign.append(wheel.name)
    return foreign


class ForeignWheels(RuntimeError):
    """The wheelhouse was built for another Python than the one that would load it."""


def unpack(folder: Path, site: Path) -> list[str]:
    """Extract every wheel of ``folder`` into ``site`` (emptied first, unless it already holds
    exactly these wheels); the wheels' names. ``ForeignWheels`` when some are for another Python."""
    wheels = sorted(folder.glob("*.whl"))
    foreign = foreign_wheels(wheels)
    if foreign:
        raise ForeignWheels(
            f"{len(foreign)} wheels of {folder} are for another Python than this "
            f"{sys.version_info.major}.{sys.version_info.minor} (such as {foreign[0]}): not used"
        )
    manifest = "\n".join(f"{w.name} {w.stat().st_size}" for w in wheels)
    marker = site / ".wheels"
    if marker.exists() and marker.read_text() == manifest:
        return [w.name for w in wheels]
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                # <name>.data/purelib/ and .data/platlib/ go to site-packages itself; scripts and
                # headers are not needed
                parts = member.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    member.filename = "/".join(parts[2:])
                archive.extract(member, site)
    marker.write_text(manifest)
    return [w.name for w in wheels]


def missing_modules() -> list[str]:
    missing = []
    for module in REQUIRED_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an ImportError, or a version check of generated code
            missing.append(f"{module} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check.wheelhouse")
    commands = parser.add_subparsers(dest="command", required=True)
    building = commands.add_parser("build", help="download the wheels (network)")
    building.add_argument("folder", type=Path)
    building.add_argument("--python-version", default=PYTHON_VERSION, help="the CPython the wheels are for")
    unpacking = commands.add_parser("unpack", help="extract the wheels into a folder for PYTHONPATH")
    unpacking.add_argument("folder", type=Path)
    unpacking.add_argument("site", type=Path)
    commands.add_parser("check", help="name the modules the run needs and cannot import")
    args = parser.parse_args(argv)
    if args.command == "build":
        size = build(args.folder, args.python_version)
        count = len(list(args.folder.glob("*.whl")))
        print(f"{args.folder}: {count} wheels, {size / (1 << 20):.1f} MiB")
    elif args.command == "unpack":
        try:
            print(f"{len(unpack(args.folder, args.site))} wheels unpacked into {args.site}")
        except ForeignWheels as exc:
            print(exc, file=sys.stderr)
            return 4
    else:
        missing = missing_modules()
        if missing:
            print("cannot import: " + "; ".join(missing), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
