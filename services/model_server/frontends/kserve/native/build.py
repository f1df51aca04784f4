"""Build the native KServe front end (``_kserve_frontend``) beside this file.

    python -m udfserve.services.model_server.frontends.kserve.native.build    # or: bash scripts/native.sh

It is compiled on the machine that runs it, against the system's grpc++ and protobuf (Debian:
``libgrpc++-dev libprotobuf-dev protobuf-compiler pkg-config g++``) and pybind11 (the
``native`` extra). The KServe messages are generated from the descriptors of the modules the
Python front end uses (``udfserve.protocol.kserve``, installed with the package, where ``protos/``
is not), so both front ends speak exactly the same protocol. A build
whose inputs (the source, the descriptors, the compiler's flags, this interpreter) have not
changed is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

logger = logging.getLogger("udfserve.native.build")

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "kserve_frontend.cpp"
MODULE_NAME = "_kserve_frontend"
PROTO_FILES = ("model_config.proto", "grpc_service.proto")
CXX_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG")
SYSTEM_PACKAGES = "libgrpc++-dev libprotobuf-dev protobuf-compiler pkg-config g++"


class BuildError(RuntimeError):
    """The module cannot be built here; the message says what is missing."""


def module_path() -> Path:
    return HERE / f"{MODULE_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"


def descriptor_set() -> bytes:
    """The KServe messages of the Python front end as a FileDescriptorSet, for protoc."""
    from google.protobuf import descriptor_pb2

    from udfserve.protocol.kserve import grpc_service_pb2, model_config_pb2

    files = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, grpc_service_pb2):
        proto = files.file.add()
        module.DESCRIPTOR.CopyToProto(proto)
    return files.SerializeToString()


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"{name} not found; install the system packages {SYSTEM_PACKAGES}")
    return path


def _pkg_config(*args: str) -> list[str]:
    result = subprocess.run(
        [_tool("pkg-config"), *args, "grpc++", "protobuf"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BuildError(
            f"pkg-config cannot find grpc++ and protobuf ({result.stderr.strip()}); install the system "
            f"packages {SYSTEM_PACKAGES}"
        )
    return result.stdout.split()


def _pybind11_include() -> str:
    try:
        import pybind11
    except ImportError as exc:
        raise BuildError("pybind11 is not installed; install the project's 'native' extra") from exc
    return str(pybind11.get_include())


def _run(command: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(command[:2])}... failed:\n{result.stderr.strip()[-4000:]}")


def _toolchain_versions(gxx: str, protoc: str) -> str:
    """What the module was built with: a system upgrade of any of them means a rebuild."""
    import pybind11

    versions = [
        sys.version,
        pybind11.__version__,
        *_pkg_config("--modversion"),
        *(
            subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()
            for command in ([gxx, "-dumpfullversion"], [protoc, "--version"])
        ),
    ]
    return "\n".join(versions)


def _imports(target: Path) -> bool:
    """Whether the built module loads, in a fresh interpreter (a library it links may be gone).
    It is loaded from its file, so that the check also runs where the package is not installed
    yet (the package build's own environment)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location({MODULE_NAME!r}, sys.argv[1]); "
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))",
            str(target),
        ],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def build(work: Path, force: bool = False) -> Path:
    """Compile the module into this package's folder (unless up to date); its path. The package
    build (setup.py) calls it too, and copies the module into the wheel or editable install."""
    descriptors = descriptor_set()
    include = [
        *(f"-I{path}" for path in (sysconfig.get_paths()["include"], _pybind11_include())),
        *_pkg_config("--cflags"),
    ]
    libs = _pkg_config("--libs")
    gxx = _tool("g++")
    protoc = _tool("protoc")
    digest = hashlib.sha256()
    # pybind11 counts by its version (_toolchain_versions), not its folder: a package build's pybind11
    # lives in a new temporary environment each time
    flags = [*CXX_FLAGS, *(flag for flag in include if flag != f"-I{_pybind11_include()}"), *libs]
    for part in (SOURCE.read_bytes(), descriptors, " ".join(flags).encode()):
        digest.update(part)
    digest.update(_toolchain_versions(gxx, protoc).encode())
    stamp = digest.hexdigest()
    target = module_path()
    stamp_file = target.with_suffix(".stamp")
    up_to_date = target.exists() and stamp_file.exists() and stamp_file.read_text() == stamp
    if not force and up_to_date and _imports(target):
        logger.info("%s is up to date", target.name)
        return target

    generated = work / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    (work / "kserve.pb").write_bytes(descriptors)
    _run([protoc, f"--descriptor_set_in={work / 'kserve.pb'}", f"--cpp_out={generated}", *PROTO_FILES], work)
    sources = [generated / name.replace(".proto", ".pb.cc") for name in PROTO_FILES] + [SOURCE]
    objects = [work / (source.stem + ".o") for source in sources]

    def compile_one(source: Path, output: Path) -> None:
        _run([gxx, *CXX_FLAGS, *include, f"-I{generated}", "-c", str(source), "-o", str(output)], work)

    logger.info("compiling %d files with %s (about a minute)", len(sources), gxx)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(compile_one, s, o) for s, o in zip(sources, objects, strict=True)]:
            future.result()
    partial = target.with_suffix(".partial")
    _run([gxx, "-shared", *map(str, objects), *libs, "-o", str(partial)], work)
    partial.replace(target)
    stamp_file.write_text(stamp)
    logger.info("built %s", target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m udfserve.services.model_server.frontends.kserve.native.build",
        description="Build the native KServe front end (grpc++) for --kserve-frontend native.",
    )
    parser.add_argument("--work", type=Path, default=Path("build") / "native", help="build folder")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build(args.work.resolve(), args.force)
    except BuildError as exc:
        logger.error("cannot build the native KServe front end: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
