"""The project builds as pip builds it on every install: no build-backend deprecation notices,
and the licence declared as an SPDX expression."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from deploy_files import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def build_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """pip's output building the project's wheel (in an isolated build environment, as an
    install does), and the wheel; built from a copy so the checkout gets no build folders."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    source.mkdir()
    for name in ("pyproject.toml", project["project"]["readme"]):
        shutil.copy(ROOT / name, source / name)
    for package in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = package.removesuffix("*")
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    [wheel] = (root / "dist").glob("udfserve-*.whl")
    return completed.stdout + completed.stderr, wheel


def test_building_the_project_prints_no_deprecation_notice(build_output: tuple[str, Path]) -> None:
    output, _ = build_output
    assert "deprecated" not in output.lower()


def test_the_licence_is_declared_as_an_spdx_expression(build_output: tuple[str, Path]) -> None:
    _, wheel = build_output
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
