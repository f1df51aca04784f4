"""What pyproject.toml cannot say: which packages the card's folders become, and the native build.

The repository keeps the product card's folders (``services/``, ``spark_client/``), but a user's
environment gets only the ``udfserve`` namespace: ``services/`` installs as ``udfserve.services`` and
``spark_client/`` as ``udfserve.spark_client``. A generic top-level ``services`` would collide with a
user's own package of that name (docs/architecture.md, "Packages and folders").

The package build also compiles the native KServe front end (``--kserve-frontend native``), so a
wheel built on a machine with the system's grpc++ carries it and an editable install has it in
place. It is optional: where grpc++, protoc or a compiler is missing, the build says so and the
package installs without it (the python front end serves KServe). ``UDFSERVE_NATIVE_BUILD``
chooses: ``auto`` (the default), ``off`` (never try), ``require`` (fail the build without it).
Everything else about the build is in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# folder in the repository -> the package it installs as
MAPPED_FOLDERS = {"services": "udfserve.services", "spark_client": "udfserve.spark_client"}
NATIVE_FOLDER = Path("services/model_server/frontends/kserve/native")
NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"
NATIVE_MODES = ("auto", "off", "require")

logger = logging.getLogger("udfserve.setup")


def _packages_of(folder: str, package: str) -> list[str]:
    return [package, *(f"{package}.{name}" for name in find_packages(where=folder))]


def _native_mode() -> str:
    mode = os.environ.get("UDFSERVE_NATIVE_BUILD", "auto").strip().lower() or "auto"
    if mode not in NATIVE_MODES:
        raise SystemExit(f"UDFSERVE_NATIVE_BUILD={mode!r}: expected one of {', '.join(NATIVE_MODES)}")
    return mode


class BuildNativeFrontend(build_ext):
    """Compiles the native front end with its own builder (protoc, then g++ against pkg-config's
    grpc++): the same code as ``python -m ...kserve.native.build``, which skips an up-to-date build."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name != NATIVE_MODULE:
            super().build_extension(ext)
            return
        mode = _native_mode()
        if mode == "off":
            logger.warning("native KServe front end: not built (UDFSERVE_NATIVE_BUILD=off)")
            return
        spec = importlib.util.spec_from_file_location(
            "_udfserve_native_build", ROOT / NATIVE_FOLDER / "build.py"
        )
        assert spec is not None and spec.loader is not None
        builder = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(ROOT))  # its descriptors come from udfserve.protocol.kserve in this tree
        try:
            spec.loader.exec_module(builder)
            # built beside its source first, where its stamp lets every later install (each
            # `pip install -e .` of scripts/venv.sh) skip an up-to-date build, then copied to where
            # this build puts its files (the wheel's tree, or the editable install's)
            built = builder.build((ROOT / "build" / "native").resolve())
            target = Path(self.get_ext_fullpath(ext.name)).resolve()
            if target != built:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, target)
        except Exception as exc:  # an option of the server, never a reason for the install to fail
            if mode == "require":
                raise SystemExit(f"native KServe front end (UDFSERVE_NATIVE_BUILD=require): {exc}") from exc
            logger.warning(
                "native KServe front end: not built (%s: %s); the package installs without it and serves "
                "KServe with the python front end (bash scripts/native.sh builds it later)",
                type(exc).__name__,
                exc,
            )
        finally:
            sys.path.remove(str(ROOT))


setup(
    packages=[
        *find_packages(include=["udfserve", "udfserve.*"]),
        *(name for folder, package in MAPPED_FOLDERS.items() for name in _packages_of(folder, package)),
    ],
    package_dir={"udfserve": "udfserve", **{package: folder for folder, package in MAPPED_FOLDERS.items()}},
    ext_modules=[
        Extension(NATIVE_MODULE, sources=[str(NATIVE_FOLDER / "kserve_frontend.cpp")], optional=True)
    ],
    cmdclass={"build_ext": BuildNativeFrontend},
)
