"""The package build carries the native KServe front end: a wheel built where the system's grpc++
is present holds the compiled module, and ``UDFSERVE_NATIVE_BUILD=off`` builds one without it.

The wheel is built by pip from a copy of this checkout (a build folder of its own, so nothing of
an earlier build is packed), with this environment's setuptools, pybind11 and protobuf
(``--no-build-isolation``: no download). The module is already built beside its source
(scripts/test.sh builds it) and copied with it, so the build finds it up to date and only copies
it into the wheel: no compiler runs here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from udfserve.services.model_server.frontends.kserve.native import load_frontend_module
from udfserve.services.model_server.frontends.kserve.native.build import module_path

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = (".git", ".venv", "build", "*.egg-info", "__pycache__", "model_repository", "results")
MODULE_IN_WHEEL = f"udfserve/services/model_server/frontends/kserve/native/{module_path().name}"


def _wheel(work: Path, mode: str) -> Path:
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFT_OUT))
    into = work / "wheels"
    env = {**os.environ, "UDFSERVE_NATIVE_BUILD": mode}
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-w", str(into), str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    [wheel] = into.glob("udfserve-*.whl")
    return wheel


def test_a_wheel_built_here_carries_the_native_front_end(tmp_path: Path) -> None:
    load_frontend_module()  # built beside its source, as scripts/test.sh leaves it

    wheel = _wheel(tmp_path, "auto")

    with zipfile.ZipFile(wheel) as archive:
        assert MODULE_IN_WHEEL in archive.namelist()
        assert archive.getinfo(MODULE_IN_WHEEL).file_size == module_path().stat().st_size
    assert not wheel.name.endswith("-none-any.whl"), f"{wheel.name}: a compiled module needs a platform tag"


def test_a_wheel_built_with_the_native_build_off_has_no_native_module(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "off")

    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.endswith(".so")]
